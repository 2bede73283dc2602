"""The auto-parallel planner: a cost model (cost.py) over a device table (devices.py) and a search over layouts
(search.py) over model shapes, batches and devices; it never names the spec (flywheel/spec/auto.py applies
it to a job). Pure: no torch and no I/O but one read: a pretrained model's config.json (pretrained.py), so
`flywheel plan` sizes any model on any machine."""

from flywheel.layout.shape import ModelShape
from flywheel.planner.cost import Batch, Estimate, Layout, estimate
from flywheel.planner.devices import DEVICES, Device, DeviceTableError, Link, device_table
from flywheel.planner.search import PlanError, PlanResult, plan_layout

__all__ = ["DEVICES", "Batch", "Device", "DeviceTableError", "Estimate", "Layout", "Link", "ModelShape", "PlanError",
           "PlanResult", "device_table", "estimate", "plan_layout"]
