"""AppWorld on the real ``appworld`` package: managed runtime, HTTP client, env, fixture world.

``appworld`` lives in its own virtualenv (``.venv-appworld``) and is reached over its
environment server's HTTP API; nothing here imports it. See ``docs/appworld.md``.
"""
