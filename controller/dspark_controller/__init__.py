"""DSpark budget controller: online SPS profiles and verify-budget decisions.

Modules
-------
protocol      versioned ZeroMQ wire protocol (pydantic v2 models, framing, limits)
client        the worker-side ControllerClient (the only worker code that speaks the protocol)
sps_model     online step-time model t(R, B) and its SGLang table exports (pure numpy)
profile_file  schema of the persisted profile files
planner       Algorithm 1 (exact, early stop), the lagged production variant, SLA and overrides
server        the controller process
cli           ``dspark-controller`` command line (serve, status, set, plan)
endpoints     endpoint derivation, bind safety, CurveZMQ key loading
sim           synthetic engines with known step-time curves (tests and benchmark)
profiling     ``profile``: measure a live SGLang server (active) or fetch a controller's profile (passive)
profile_tools the profiles library: build, validate, export/import SGLang tables, show, diff
plots         PNG pictures of profiles (matplotlib, imported lazily)
profile_cli   the profile subcommands of ``dspark-controller``

Only ``planner``, ``sps_model`` and ``profile_file`` are imported eagerly by callers
that run inside the decode loop; nothing here imports SGLang.
"""

__version__ = "0.1.0"
