"""What CUPTI's tracing does to the numbers graphmon reports (the observer effect), and what can time every replay."""
