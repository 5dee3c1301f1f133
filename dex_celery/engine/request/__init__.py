"""The requesters' room: a request becomes records and first attempts (validation, admission,
budgets, publishing), and a person's decisions on the calls that wait for one (approvals,
edits, previews)."""
