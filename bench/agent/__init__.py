"""Whether one graphmon agent holds many collectors and hostile peers."""
