"""What serving a request needs, built once per application: the settings, the engines and their
queues, the keys, the sealer, and the optional gateway, search provider and media intake."""

from __future__ import annotations

from dataclasses import dataclass

from kimi_server.gate.auth import KeyRing
from kimi_server.gate.auth_throttle import AuthThrottle
from kimi_server.gate.gateway import Gateway
from kimi_server.gate.queues import AdmissionSet
from kimi_server.media.intake import MediaIntake
from kimi_server.search.searcher import Searcher
from kimi_server.serving.common import EngineSet
from kimi_server.serving.sealing import Sealer
from kimi_server.settings import Settings


@dataclass
class Services:
    settings: Settings
    engines: EngineSet
    keys: KeyRing
    sealer: Sealer
    queues: AdmissionSet
    throttle: AuthThrottle  # failed authentications, counted and slowed (gate/auth_throttle.py)
    gateway: Gateway | None = None  # None when turned off
    searcher: Searcher | None = None  # None when no provider
    media: MediaIntake | None = None
