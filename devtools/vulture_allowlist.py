"""Names `vulture` cannot see used, each with who uses it (`tests/unit/test_dead_code.py`).

Vulture reads `dex_celery/` alone; what a framework calls by name, what users call (the public
API of docs/), and what the tests read as their oracle looks unused to it. Everything else it
reports is dead and goes. The names below are bare or `_.attr`: vulture counts any use of a name.
"""

# ruff: noqa: B018, F821
# mypy: ignore-errors

# --- click: commands registered by their decorator on a group (`dex_celery/cli/`) -------------
list_approvals
keygen
export_command
budgets_show
calls_list
calls_show
prune_command
list_servers
db_upgrade
db_downgrade
db_current
db_rebind_ledger
sessions_show
webhooks_status
_.obj  # click's context object, read by `pass_context` (cli/context.py)

# --- Celery: configuration read by name, tools registered by decorator ------------------------
_.task_default_queue  # Celery reads it from the app's conf (examples/orderdesk/factory.py)
lookup_order  # the example's tools, registered by their decorator (README.md)
add_order_note
cancel_order
print_shipping_label

# --- Python protocols and the standard library's hooks ----------------------------------------
_.__suppress_context__  # read by the traceback printer (backend_errors.py)
_.__wrapped__  # read by inspect.signature / functools (processes/consumer.py)
__iter__  # Mapping protocol (model/effects.py)
__len__
memo  # __deepcopy__'s parameter, named by the copy module (model/effects.py)
tb  # __exit__'s parameter (testing/tcpproxy.py)
_.msg  # logging.LogRecord's message, rewritten in place (tools/log_scrub.py)
_.log_message  # http.server.BaseHTTPRequestHandler hook (ops/metrics.py, testing/models)
address_family  # socketserver.TCPServer attribute (ops/metrics.py)
_.daemon_threads  # socketserver.ThreadingMixIn attribute (testing/models/claude_messages.py)
_.do_GET  # http.server.BaseHTTPRequestHandler dispatch by method name
_.do_POST
_.collect  # prometheus_client collector protocol (ops/metrics.py)

# --- SQLAlchemy and Alembic: hooks and module attributes read by name --------------------------
_sqlite_pragmas  # an `event.listens_for` connect listener (store/sql_engine.py)
_begin  # an `event.listens_for` begin listener (store/green_sqlite.py)
_end  # an `event.listens_for` commit and rollback listener (store/green_sqlite.py)
_returned  # an `event.listens_for` pool checkin listener (store/green_sqlite.py)
_watch  # the statement trace's connect listener (store/statement_trace.py)
parent_names  # Alembic's `include_name(name, type_, parent_names)` signature (migrations/env.py)
down_revision  # Alembic reads each migration's module attributes (store/migrations/versions/)
branch_labels
depends_on

# --- pydantic and the MCP SDK: model fields and config ----------------------------------------
model_config  # pydantic's model configuration (integrations/mcp_task_call.py, frameworks/crewai.py)
result_type  # MCP SDK request fields (integrations/mcp_task_call.py)
name_param
identifier

# --- values: enum members and dataclass fields read by value or through asdict ----------------
lost  # SweepReport fields, shown through `as_dict()` (engine/sweep.py, `dex-celery sweep`)
expired
timed_out
approvals_expired
ended_after_data_loss
open_without_check  # ReconcileReport field, shown by `dex-celery reconcile` (engine/reconcile.py)
opened  # a session's state, a dataclass field (integrations/mcp_sessions.py)
effect_source  # PolicySnapshot field, stored with every call (model/policy.py)
approval_used_at  # CallRecord field, read from the row (model/records.py)
REFUSED  # enum members: the Lua scripts and stored rows name them by value
SYSTEM
TOOL_CALL_STARTED
TOOL_CALL_LATE_RESULT
TOOL_CALL_FROZEN
_.runs  # WalCheckpointer's count, read by tests/integration/store/test_wal_checkpoint.py
_.resets  # TcpProxy's count, read by the tests that cut a link (testing/tcpproxy.py)

# --- the public API users call (docs/) ---------------------------------------------------------
_.get_tool  # Dex.get_tool, a registered tool by name (tests/integration/store/test_mcp_catalog.py)
_.outcome_check  # the @dex.outcome_check decorator (docs/reconcile.md)
_.create_schema  # dex.store.create_schema() (docs/guardrails.md, README.md)
_.trimmed_after  # AgentEvents.of(dex).trimmed_after (docs/reconcile.md)
unregister_effect_class  # the pair of register_effect_class (model/effects.py)
_.close_all  # SessionPool.close_all: the worker's shutdown is to close the MCP sessions with it

# --- the framework adapters: the framework calls them, users import them (docs/frameworks.md) -
_.before_run
DexClaude
dex_crewai_tools
dex_adk_tools
_._get_declaration
_.run_async
DexConversation
_.before_model_callback
_.on_event_callback
_.after_run_callback
dex_tools
_.abefore_model
dex_rejections
DexSession
_.function_tools
_.get_serialization_name
_.get_toolset
_.before_model_request

# --- the users' pytest kit (dex_celery/testing/, docs/testing.md) ------------------------------
pytest_plugins  # pytest loads the plugin through it
pytest_addoption  # pytest hooks
pytest_configure
_.restored  # TcpProxy's condition for `wait_for` once a cut link is back (testing/tcpproxy.py)
pytest_unconfigure
dex_database  # pytest fixtures, requested by parameter name
dex_worker
assert_at_most_once
assert_ran
assert_record_agrees
_.kill_at
_.snapshot_redis
_.roll_back_redis
_.cut_redis_link
_.restore_redis_link
_.blip
# Scripted models for the framework tests: each framework calls its model's hooks by name.
tool_call
tool_use
ScriptedChatClient
ScriptedLLM
ScriptedLlm
OTEL_PROVIDER_NAME
_._inner_get_response
_.tool_results
_.supports_function_calling
available_functions
from_task
from_agent
response_model
_.requests_of
_.generate_content_async
_._generate
run_manager
_.bind_tools
_._llm_type
_.tool_calls_made

# --- the tests' oracles: slow or second ways to read what the hot path keeps -----------------
read_archive  # tests/integration/store/test_retention.py reads the archive back
_.list_calls  # tests/crash/sweeper/test_concurrent_sweepers.py
_.count_by_outcome_scan  # tests/integration/store/test_call_counts.py, bench/scrape_cost.py
_.count_unreported_unknowns_scan  # tests/integration/store/test_call_counts.py
open_arguments  # the inverse of seal_arguments, tests/unit/tools/test_schemas.py
traced_statements  # a process's logged statements, tests/integration/engine/test_pool_sql.py
