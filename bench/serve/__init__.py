"""What scrapes of the exporter cost, and whether graphmon serve stays bounded under load."""
