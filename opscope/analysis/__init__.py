"""opscope.analysis"""
