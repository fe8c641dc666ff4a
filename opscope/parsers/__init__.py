"""opscope.parsers"""
