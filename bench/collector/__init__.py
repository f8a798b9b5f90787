"""What the collector's own work costs, measured on a CPU: decode, windows, attach, the link."""
