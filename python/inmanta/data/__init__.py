"""inmanta.data: the names of environment settings that module code refers to (std's
`AgentConfigHandler` reads `AUTOSTART_AGENT_MAP`) and the value converters modules use
(graph's `convert_boolean`). Steward keeps its own data model; this holds no tables."""

AUTO_DEPLOY = "auto_deploy"
AUTOSTART_AGENT_DEPLOY_INTERVAL = "autostart_agent_deploy_interval"
AUTOSTART_AGENT_DEPLOY_SPLAY_TIME = "autostart_agent_deploy_splay_time"
AUTOSTART_AGENT_REPAIR_INTERVAL = "autostart_agent_repair_interval"
AUTOSTART_AGENT_REPAIR_SPLAY_TIME = "autostart_agent_repair_splay_time"
AUTOSTART_AGENT_MAP = "autostart_agent_map"
AUTOSTART_ON_START = "autostart_on_start"
AGENT_TRIGGER_METHOD_ON_AUTO_DEPLOY = "agent_trigger_method_on_auto_deploy"
PURGE_ON_DELETE = "purge_on_delete"
PROTECTED_ENVIRONMENT = "protected_environment"
RESOURCE_ACTION_LOGS_RETENTION = "resource_action_logs_retention"
SERVER_COMPILE = "server_compile"


def convert_boolean(value: "bool | str") -> bool:
    """As inmanta-core's: a bool, or a string configparser reads as one ("yes", "off", …)."""
    from configparser import RawConfigParser

    if isinstance(value, bool):
        return value
    if value.lower() not in RawConfigParser.BOOLEAN_STATES:
        raise ValueError("Not a boolean: %s" % value)
    return RawConfigParser.BOOLEAN_STATES[value.lower()]


def convert_int(value: "float | int | str") -> "int | float":
    """As inmanta-core's: a number, or a string holding an int or a float."""
    if isinstance(value, (int, float)):
        return value
    # as the reference: int() of the text itself, so "1.5" is refused
    f = float(value)
    i = int(value)
    return i if i == f else f
