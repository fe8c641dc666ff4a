"""opscope.matrix"""
