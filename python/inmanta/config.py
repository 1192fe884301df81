"""inmanta.config: the configuration modules read (`Config.get(section, name, default)`).

As inmanta-core's: values come from `INMANTA_<SECTION>_<NAME>` environment variables, then
from `/etc/inmanta/inmanta.cfg`, `/etc/inmanta/inmanta.d/*.cfg`, `~/.inmanta.cfg`, `.inmanta`
and `.inmanta.cfg` (later files win), read once, on first use. Steward sets
`INMANTA_CONFIG_ENVIRONMENT` to the environment a compile is for, when it has one.
"""

import configparser
import os
from typing import Any, Optional


def _normalize_name(name: str) -> str:
    return name.replace("_", "-")


def _from_env(section: str, name: str) -> Optional[str]:
    key = f"INMANTA_{section}_{name}".upper().replace("-", "_")
    return os.environ.get(key)


class Config:
    __instance: Optional[configparser.ConfigParser] = None

    @classmethod
    def load_config(
        cls,
        min_c_config_file: Optional[str] = None,
        config_dir: Optional[str] = None,
        main_cfg_file: str = "/etc/inmanta/inmanta.cfg",
    ) -> None:
        config_dir = config_dir if config_dir is not None else "/etc/inmanta/inmanta.d"
        in_dir = (
            sorted(os.path.join(config_dir, f) for f in os.listdir(config_dir) if f.endswith(".cfg"))
            if os.path.isdir(config_dir)
            else []
        )
        files = [main_cfg_file, *in_dir, os.path.expanduser("~/.inmanta.cfg"), ".inmanta", ".inmanta.cfg"]
        if min_c_config_file is not None:
            files.append(min_c_config_file)
        parser = configparser.ConfigParser(interpolation=None)
        parser.read(files)
        cls.__instance = parser

    @classmethod
    def load_config_from_dict(cls, input_config: Any) -> None:
        parser = configparser.ConfigParser(interpolation=None)
        parser.read_dict(input_config)
        cls.__instance = parser

    @classmethod
    def get_instance(cls) -> configparser.ConfigParser:
        if cls.__instance is None:
            cls.load_config()
        assert cls.__instance is not None
        return cls.__instance

    @classmethod
    def _reset(cls) -> None:
        cls.__instance = None

    @classmethod
    def get(cls, section: Optional[str] = None, name: Optional[str] = None, default_value: Any = None) -> Any:
        if section is None:
            return cls.get_instance()
        assert name is not None
        name = _normalize_name(name)
        value = _from_env(section, name)
        if value is not None:
            return value
        return cls.get_instance().get(section, name, fallback=default_value)

    @classmethod
    def getboolean(cls, section: str, name: str, default_value: Optional[bool] = None) -> Any:
        value = _from_env(section, _normalize_name(name))
        if value is not None:
            return value.strip().lower() in ("1", "yes", "true", "on")
        return cls.get_instance().getboolean(section, _normalize_name(name), fallback=default_value)

    @classmethod
    def is_set(cls, section: str, name: str) -> bool:
        inst = cls.get_instance()
        return section in inst and _normalize_name(name) in inst[section]

    @classmethod
    def set(cls, section: str, name: str, value: str) -> None:
        inst = cls.get_instance()
        if section not in inst:
            inst.add_section(section)
        inst.set(section, _normalize_name(name), value)
