"""DSpark budget controller: online SPS profiles, the budget policy and verify-budget decisions.

Subpackages by role; imports point one way (everything uses ``core``, ``core`` uses nothing
else here, and nothing here imports SGLang):

core        numpy only: ``method`` (Algorithm 1 with early stop, the lagged production
            variant, the operator overrides), ``strategies`` (exploration, probes, the
            uniform gate, admission gain, uniform-path times), ``policy`` (the one
            ``BudgetPolicy`` the worker and the simulator run, its ``PolicyConfig``),
            ``sps_model`` (online step-time model t(R, B) and its SGLang table exports),
            ``profile_file`` (the persisted profile format)
service     the fleet service: ``protocol`` (versioned ZeroMQ wire protocol), ``server`` (the
            controller: ``Controller`` holds the decision logic, ``serve`` the socket loop),
            ``client`` (the worker-side ``ControllerClient``), ``endpoints`` (addresses, bind
            safety, CurveZMQ keys)
profiling   ``live`` (measure a live SGLang server, or fetch a controller's profile),
            ``tools`` (build, validate, export/import SGLang tables, show, diff), ``plots``
            (PNG pictures, matplotlib imported lazily), ``cli`` (the profile subcommands)
sim         the fleet simulator (``simulate``, ``policies``, ``roofline``, ``report``) and the
            synthetic engines of tests and benchmarks (``synthetic``)
cli         the ``dspark-controller`` command line
"""

__version__ = "0.1.0"
