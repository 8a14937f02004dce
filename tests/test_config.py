"""The typed config: precedence flags > environment > user file > system file > defaults."""

from __future__ import annotations

import pytest

from gpuwatch.base import config


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_defaults_when_nothing_is_set(tmp_path):
    cfg = config.load(env={}, system_file=tmp_path / "none.toml")
    assert cfg.interval == 1.0
    assert cfg.metrics_listen == ""
    assert cfg.sources == {}


def test_each_layer_overrides_the_one_below(tmp_path, monkeypatch):
    system = write(
        tmp_path / "etc.toml", 'interval = 2.0\nhost_interval = 3.0\nstall_floor = 60\nadmin_group = "ops"\n'
    )
    user = write(tmp_path / "user.toml", "host_interval = 4.0\nstall_floor = 30\nmax_db_mb = 10\n")
    monkeypatch.setenv("GPUWATCH_CONFIG", str(user))
    cfg = config.load(
        flags={"max_db_mb": 5, "interval": None},
        env={"GPUWATCH_STALL_FLOOR": "15", "GPUWATCH_CONFIG": str(user)},
        system_file=system,
    )
    assert cfg.admin_group == "ops"  # system file only
    assert cfg.interval == 2.0  # a None flag means "not given"
    assert cfg.host_interval == 4.0  # user file beats system file
    assert cfg.stall_floor == 15.0  # environment beats user file
    assert cfg.max_db_mb == 5.0  # flags beat everything
    assert cfg.sources["stall_floor"] == "environment"
    assert cfg.sources["admin_group"] == str(system)


def test_unknown_key_in_a_file_names_the_key_and_the_file(tmp_path, monkeypatch):
    user = write(tmp_path / "user.toml", "intervall = 2\n")
    monkeypatch.setenv("GPUWATCH_CONFIG", str(user))
    with pytest.raises(config.ConfigError) as e:
        config.load(env={}, system_file=tmp_path / "none.toml")
    assert str(e.value) == f"{user}: unknown key 'intervall'"


def test_unknown_environment_key_is_refused_but_handshake_variables_are_not(tmp_path):
    with pytest.raises(config.ConfigError, match="unknown key 'GPUWATCH_INTERVALL'"):
        config.load(env={"GPUWATCH_INTERVALL": "1"}, system_file=tmp_path / "none.toml")
    cfg = config.load(
        env={"GPUWATCH_RUN_ID": "abc123", "GPUWATCH_INTERVAL": "0.5"}, system_file=tmp_path / "none.toml"
    )
    assert cfg.interval == 0.5


def test_wrong_types_are_one_line_errors(tmp_path):
    bad = write(tmp_path / "etc.toml", 'interval = "fast"\n')
    with pytest.raises(config.ConfigError, match=r"etc.toml: interval must be float, got 'fast'"):
        config.load(env={}, system_file=bad)
    with pytest.raises(config.ConfigError, match="GPUWATCH_RECORD_MEMORY_HISTORY"):
        config.load(env={"GPUWATCH_RECORD_MEMORY_HISTORY": "maybe"}, system_file=tmp_path / "x.toml")
    broken = write(tmp_path / "broken.toml", "interval = \n")
    with pytest.raises(config.ConfigError, match="broken.toml: invalid TOML"):
        config.load(env={}, system_file=broken)


def test_paths_follow_the_mode(tmp_path):
    user = config.load(env={}, system_file=tmp_path / "none.toml")
    assert str(user.db_path).startswith(str(tmp_path / "data"))
    system = config.load(flags={"system": True}, env={}, system_file=tmp_path / "none.toml")
    assert str(system.db_path) == "/var/lib/gpuwatch/gpuwatch.db"
    assert str(system.socket_path) == "/run/gpuwatch/gpuwatch.sock"
