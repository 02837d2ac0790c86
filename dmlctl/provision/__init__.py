"""Provisioning: the preflight doctor (every host checked at once, every failure kept).

See :mod:`dmlctl.provision.doctor` (checks, reports, rendering) and
:mod:`dmlctl.provision.probe` (the scripts run on the hosts).
"""

from dmlctl.provision.doctor import (
    Check,
    DoctorReport,
    HostReport,
    doctor_json,
    render_doctor,
    run_doctor,
)

__all__ = ["Check", "DoctorReport", "HostReport", "doctor_json", "render_doctor", "run_doctor"]
