"""What graphmon costs a serving process on a GPU host: host impact, attach, CUPTI idle and tracing cost."""
