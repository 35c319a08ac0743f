"""Serving helpers: server configs -> ``sglang.launch_server`` commands, and a CPU demo server.

- :mod:`sglang_spec.serving.configs` -- load a ``server_configs/*.yaml`` file and turn it into argv.
- :mod:`sglang_spec.serving.launch` -- ``sglang-spec serve CONFIG``: start SGLang, wait for ``/health``, stop cleanly.
- :mod:`sglang_spec.serving.cpu_server` -- ``sglang-spec cpu-server``: an SGLang-compatible HTTP front end over a
  pluggable (CPU) engine. A demo/test server, not a production engine.

Nothing here imports ``sglang`` or ``torch`` at module import time.
"""
