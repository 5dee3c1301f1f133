"""`dex-celery web`: approvals, calls and unknown outcomes in a browser, and `/metrics`.

Pages are rendered on the server (Starlette + Jinja2, served by uvicorn; no JavaScript). Every
page and `/metrics` needs a signed-in user or a token with the right scope (`dex_celery.access`,
`web.auth`); the app refuses to listen on an address other than loopback without credentials
configured (`web.server`) and answers only allowed `Host` names (docs/security.md). Decisions go
through the same `Approvals` code as the CLI, so two people deciding at once get the same
one-winner result, and the approver recorded is the signed-in user or the token's name.

Needs the `web` extra: `pip install 'dex-celery[web]'`.
"""
