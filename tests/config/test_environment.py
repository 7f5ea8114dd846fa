"""`PDGW_...` environment overrides of any setting, and `_FILE` variants for secrets."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from router.config import ConfigError, load_config

DOCUMENT = {
    "models": [
        {
            "name": "m",
            "tokenizer": "deepseek",
            "throughput": {"mode": "proxy", "urls": ["http://p:1"]},
        }
    ]
}


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(DOCUMENT), encoding="utf-8")
    return path


def test_settings_at_any_depth_typed_as_yaml(config_file: Path, tmp_path: Path) -> None:
    (tmp_path / "admin.key").write_text("s3cret\n")
    config = load_config(
        config_file,
        {
            "PDGW_SERVER__PORT": "9001",
            "PDGW_SERVER__HOST": "0.0.0.0",
            "PDGW_LOGGING__FORMAT": "json",
            "PDGW_LIMITS__MAX_STOP_STRINGS": "4",
            "PDGW_MODELS__0__OUTPUT_PARSER": "deepseek_v32",
            "PDGW_MODELS__0__THROUGHPUT__URLS": "[http://a:1, http://b:2]",
            "PDGW_ADMIN__API_KEY_FILE": str(tmp_path / "admin.key"),
            "UNRELATED": "x",
        },
    )
    assert (config.server.host, config.server.port) == ("0.0.0.0", 9001)
    assert config.logging.format == "json" and config.limits.max_stop_strings == 4
    model = config.models[0]
    assert model.output_parser == "deepseek_v32"
    assert model.throughput is not None and model.throughput.urls == ["http://a:1", "http://b:2"]
    assert config.admin.api_key == "s3cret", "a _FILE variant sets the setting to the contents"


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"PDGW_SERVER__PORT": "not-a-port"}, "server.port"),
        ({"PDGW_SERVRE__PORT": "1"}, "did you mean 'server'"),
        ({"PDGW_MODELS__3__NAME": "x"}, "PDGW_MODELS__3__NAME: no entry 3"),
        ({"PDGW_ADMIN__API_KEY_FILE": "/nonexistent/key"}, "PDGW_ADMIN__API_KEY_FILE: cannot read"),
    ],
)
def test_bad_overrides_are_named(config_file: Path, environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(config_file, environ)


WITH_KEYS = {
    **DOCUMENT,
    "admin": {"api_key": "file-secret"},
    "auth": {"api_keys": [{"name": "a", "key_env": "CLIENT_KEY"}]},
    "gate": {"backend": "redis", "redis": {"url": "redis://r:6379/0", "password": "pw"}},
}


@pytest.mark.parametrize("value", ["", "   ", '""', "''", "null", "~"])
@pytest.mark.parametrize(
    "variable",
    [
        "PDGW_ADMIN__API_KEY",
        "PDGW_ADMIN__API_KEY_ENV",
        "PDGW_AUTH__API_KEYS__0__KEY_ENV",
        "PDGW_AUTH__API_KEYS__0__SHA256",
        "PDGW_GATE__REDIS__PASSWORD",
    ],
)
def test_an_empty_key_from_the_environment_is_refused_never_a_removal(
    tmp_path: Path, variable: str, value: str
) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(WITH_KEYS), encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        load_config(path, {variable: value, "CLIENT_KEY": "k"})
    assert str(refused.value) == (
        f"{variable}: empty, and an empty key is never a key (unset the variable to keep the"
        " file's)"
    )


def test_an_empty_key_file_named_by_the_environment_is_refused(
    config_file: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "admin.key"
    empty.write_text("\n")
    with pytest.raises(ConfigError) as refused:
        load_config(config_file, {"PDGW_ADMIN__API_KEY_FILE": str(empty)})
    assert str(refused.value) == (
        f"PDGW_ADMIN__API_KEY_FILE: {empty} is empty, and an empty key is never a key (unset"
        " the variable to keep the file's)"
    )


@pytest.mark.parametrize("value", ["123", "yes", "0x1f", "'quoted'"])
def test_a_key_from_the_environment_is_text(config_file: Path, value: str) -> None:
    config = load_config(config_file, {"PDGW_ADMIN__API_KEY": value})
    assert config.admin.api_key == ("quoted" if value == "'quoted'" else value)
