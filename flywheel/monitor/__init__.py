"""The health monitor: Prometheus queries and the loop that feeds `policy.health` and hands decisions over."""

from flywheel.monitor.actions import HealthActions, JobInventory
from flywheel.monitor.loop import HealthMonitor, MonitorSettings, add_monitor_arguments, settings_from_args
from flywheel.monitor.metrics import OperatorMetrics
from flywheel.monitor.prometheus import PrometheusClient, PrometheusError, Sample

__all__ = ["HealthActions", "HealthMonitor", "JobInventory", "MonitorSettings", "OperatorMetrics", "PrometheusClient",
           "PrometheusError", "Sample", "add_monitor_arguments", "settings_from_args"]
