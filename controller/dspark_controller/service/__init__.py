"""The fleet service: the ZeroMQ protocol, the controller process (its decision logic in
``server.Controller``, separate from the socket loop), the worker-side client and the
endpoint rules.  Uses :mod:`dspark_controller.core`."""
