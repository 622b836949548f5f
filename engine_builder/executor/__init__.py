"""Serving: an executor thread with in-flight batching over one LLM (see executor.py)."""

from engine_builder.executor.executor import Executor, ExecutorStats
from engine_builder.executor.request import RequestFailed, RequestHandle, TokenEvent
from engine_builder.runner.scheduling.scheduler import SchedulerConfig

__all__ = ["Executor", "ExecutorStats", "RequestFailed", "RequestHandle", "SchedulerConfig", "TokenEvent"]
