"""The life of a call: request, attempts, the worker's task body, outcomes, sweeps, approvals,
reconciliation.

`runtime.py` builds this process's components once and hands each its collaborators; nothing in
this package imports the façade (`dex_celery.app`), the CLI, the web app or the operators' side
(`tests/unit/test_architecture.py` checks it).
"""
