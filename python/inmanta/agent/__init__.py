"""The executor side of Steward's Inmanta compatibility package: `inmanta.agent.handler`
(`@provider`, `CRUDHandler`, `HandlerContext`, `@cache`) and the cache behind it. Steward's
handler host (`steward_handler_host.py`) drives it."""
