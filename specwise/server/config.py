"""Server settings as one dataclass; `specwise serve` flags are generated from these fields."""

import ipaddress
from dataclasses import dataclass, field

from specwise.errors import ConfigError

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


@dataclass
class ServerConfig:
    host: str = field(default="127.0.0.1", metadata={"help": "address to bind; loopback unless you mean it"})
    port: int = field(default=8000, metadata={"help": "TCP port (0 picks a free one)"})
    api_key: str | None = field(
        default=None, metadata={"help": "require 'Authorization: Bearer KEY' on /v1 (or set SPECWISE_API_KEY); "
                                        "KEY1,KEY2,... for several tenants: suffix decoding's cache of earlier "
                                        "responses never drafts one key's text for another's"})
    served_model_name: str | None = field(
        default=None, metadata={"help": "model id clients send and /v1/models lists; default: the model's name"})
    max_queue: int = field(
        default=256, metadata={"help": "requests admitted beyond --max-num-seqs before answering 429"})
    max_body_bytes: int = field(default=1 << 20, metadata={"help": "largest request body accepted, bytes"})
    shutdown_timeout: float = field(
        default=30.0, metadata={"help": "seconds in-flight requests get to finish on shutdown before abort"})
    watchdog_timeout: float = field(
        default=120.0, metadata={"help": "seconds one engine step may run before the engine is declared dead "
                                         "(/health 503, streams end with an error, the server exits 1 for its "
                                         "supervisor to restart it); 0: no watchdog"})
    keep_alive_timeout: float = field(
        default=75.0, metadata={"help": "seconds an idle keep-alive connection stays open; keep it longer than "
                                        "clients' pool expiry (httpx: 5 s) so a reused connection is never "
                                        "closed under a request"})
    log_level: str = field(default="warning", metadata={"help": "uvicorn log level"})
    wait_for_compile: bool = field(
        default=False, metadata={"help": "with --compile, when the compile cache lacks the graphs: compile them "
                                         "before serving (minutes), instead of serving eagerly at once while another "
                                         "process compiles them and switching over when they are ready"})

    def __post_init__(self):
        if not self.host:
            raise ConfigError("host must not be empty")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in 0..65535, got {self.port}")
        if self.api_key is not None and not all(key.strip() for key in self.api_key.split(",")):
            raise ConfigError("api_key must not be empty, nor hold an empty key between commas "
                              "(omit it to serve without a key)")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ConfigError("served_model_name must not be empty")
        if self.max_queue < 0:
            raise ConfigError(f"max_queue must be >= 0, got {self.max_queue}")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.shutdown_timeout < 0:
            raise ConfigError(f"shutdown_timeout must be >= 0, got {self.shutdown_timeout}")
        if self.watchdog_timeout < 0:
            raise ConfigError(f"watchdog_timeout must be >= 0 (0: off), got {self.watchdog_timeout}")
        if self.keep_alive_timeout <= 0:
            raise ConfigError(f"keep_alive_timeout must be > 0, got {self.keep_alive_timeout}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False
