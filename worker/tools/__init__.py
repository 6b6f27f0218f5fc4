"""Tool calling on chat requests: prompt rendering, the calls' grammar and their parsing (README.md)."""

from worker.tools.calls import CallParser
from worker.tools.errors import ToolError
from worker.tools.plan import ToolPlan, check_tools, plan_tools
from worker.tools.prompt import render_chat

__all__ = ["CallParser", "ToolError", "ToolPlan", "check_tools", "plan_tools", "render_chat"]
