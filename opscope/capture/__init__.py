"""opscope.capture"""
