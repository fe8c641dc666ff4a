"""opscope.report"""
