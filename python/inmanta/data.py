"""inmanta.data: the names of environment settings that module code refers to (std's
`AgentConfigHandler` reads `AUTOSTART_AGENT_MAP`). Steward keeps its own data model; this
holds the names only."""

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
