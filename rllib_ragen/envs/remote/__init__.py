"""Text environments served over HTTP, both ways, in two protocols.

- ``wire.py``: what both ends share (protocol names, the client's error, what a reset sends, the error log);
- ``client.py``: :class:`RemoteTextEnv`, our protocol's client (a session per episode, numbered steps: a client
  reconnects and retries a step whose answer was lost without stepping twice);
- ``server.py``: our protocol's server, ``python -m rllib_ragen.envs.remote.server --env ID --port P`` (``--protocol
  openenv`` serves OpenEnv's instead);
- ``openenv.py``, ``openenv_server.py``, ``openenv_client.py``: OpenEnv's protocol on the ``openenv`` extra, its wire
  types, any registered environment served to OpenEnv's clients, and any OpenEnv server played
  (:class:`~rllib_ragen.envs.remote.openenv_client.OpenEnvTextEnv`).

``rllib_ragen/Remote-v0`` builds either client through :func:`remote_text_env`.
"""

from __future__ import annotations

from typing import Any

from .client import RemoteTextEnv
from .wire import PROTOCOLS, RemoteEnvError


def remote_text_env(url: str, protocol: str = "rllib_ragen", **kwargs: Any) -> RemoteTextEnv:
    """The client of ``protocol`` for the server at ``url`` (``rllib_ragen/Remote-v0``'s entry point): a
    :class:`RemoteTextEnv` for ours, an ``OpenEnvTextEnv`` for ``"openenv"`` (needs the ``openenv`` extra). The other
    arguments are :class:`RemoteTextEnv`'s."""
    if protocol != "openenv":
        return RemoteTextEnv(url, protocol=protocol, **kwargs)
    try:
        from .openenv_client import OpenEnvTextEnv
    except ImportError as error:
        raise ImportError(
            f"protocol='openenv' needs the openenv package ({error}): pip install \"rllib_ragen[openenv]\""
        ) from None
    return OpenEnvTextEnv(url, protocol=protocol, **kwargs)


__all__ = ["PROTOCOLS", "RemoteEnvError", "RemoteTextEnv", "remote_text_env"]
