"""What the gateway tells about itself: Prometheus metrics declared once, log lines, and the
access record each request fills in."""
