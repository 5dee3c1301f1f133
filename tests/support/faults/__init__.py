"""Faults a test causes and reads back: SIGKILL, cut links, Sentinel failover, wrong clocks, a full Redis, RabbitMQ nodes."""
