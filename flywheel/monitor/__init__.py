"""The health monitor: Prometheus queries and the loop that feeds `policy.health_checks` and hands decisions over."""

from flywheel.monitor.executor_api import HealthActions, JobInventory
from flywheel.monitor.findings import FindingsInbox
from flywheel.monitor.health_loop import HealthMonitor, MonitorSettings, add_monitor_arguments, settings_from_args
from flywheel.monitor.operator_metrics import OperatorMetrics
from flywheel.monitor.prometheus import PrometheusClient, PrometheusError, Sample

__all__ = ["FindingsInbox", "HealthActions", "HealthMonitor", "JobInventory", "MonitorSettings", "OperatorMetrics",
           "PrometheusClient",
           "PrometheusError", "Sample", "add_monitor_arguments", "settings_from_args"]
