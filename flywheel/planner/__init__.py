"""The auto-parallel planner: a cost model (cost.py) over a device table (devices.py) and a search over layouts
(search.py). Pure: no torch and no I/O but one read: a pretrained model's config.json (pretrained.py), so
`flywheel plan` sizes any model on any machine."""

from flywheel.planner.cost import Batch, Estimate, Layout, estimate
from flywheel.planner.devices import DEVICES, Device, DeviceTableError, Link, device_table
from flywheel.planner.search import PlanError, PlanResult, plan_for_spec, plan_layout, resolve_auto, shape_of
from flywheel.spec_model import ModelShape

__all__ = ["DEVICES", "Batch", "Device", "DeviceTableError", "Estimate", "Layout", "Link", "ModelShape", "PlanError",
           "PlanResult", "device_table", "estimate", "plan_for_spec", "plan_layout", "resolve_auto", "shape_of"]
