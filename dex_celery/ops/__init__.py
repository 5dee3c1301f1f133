"""The operators' read side: status, metrics, webhooks, and how records look to a person."""
