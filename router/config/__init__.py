"""`router.yaml`, the gateway's configuration: its schema (`schema`), how a file becomes a
validated `GatewayConfig` (`loading`, `environment`, `errors`), and secrets (`secrets`).

Everything the rest of the gateway needs is importable from here. These models validate the
file; the running gateway works on the runtime types built from them.
"""

from router.config.environment import ENV_PREFIX, apply_environment
from router.config.errors import ConfigError
from router.config.loading import compile_rules, load_config, parse_config
from router.config.secrets import read_secret
from router.config.settings import (
    AdminConfig,
    ApiKeyConfig,
    AuthConfig,
    ClassificationConfig,
    DiscoveryConfig,
    GateConfig,
    GatewayConfig,
    KvEventsConfig,
    LatencyConfig,
    LatencyPoolConfig,
    LimitsConfig,
    LoggingConfig,
    ModelConfig,
    NodeConfig,
    PrefillEngineConfig,
    ProxyConfig,
    PullConfig,
    PushConfig,
    RedisAddress,
    RedisDeployment,
    RedisGateConfig,
    SelectionConfig,
    SelectionWeights,
    ServerConfig,
    StrictModel,
    ThroughputConfig,
    TileRTVersion,
    TimeoutsConfig,
    UpstreamCredential,
    UpstreamsConfig,
)

__all__ = [
    "ENV_PREFIX",
    "AdminConfig",
    "ApiKeyConfig",
    "AuthConfig",
    "ClassificationConfig",
    "ConfigError",
    "DiscoveryConfig",
    "GateConfig",
    "GatewayConfig",
    "KvEventsConfig",
    "LatencyConfig",
    "LatencyPoolConfig",
    "LimitsConfig",
    "LoggingConfig",
    "ModelConfig",
    "NodeConfig",
    "PrefillEngineConfig",
    "ProxyConfig",
    "PullConfig",
    "PushConfig",
    "RedisAddress",
    "RedisDeployment",
    "RedisGateConfig",
    "SelectionConfig",
    "SelectionWeights",
    "ServerConfig",
    "StrictModel",
    "ThroughputConfig",
    "TileRTVersion",
    "TimeoutsConfig",
    "UpstreamCredential",
    "UpstreamsConfig",
    "apply_environment",
    "compile_rules",
    "load_config",
    "parse_config",
    "read_secret",
]
