"""``opscope diff``: two profiles of one job, paired operator by operator and step by step."""
