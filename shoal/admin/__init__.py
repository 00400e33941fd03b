"""The admin listener: health checks, Prometheus metrics, the admin API and the console."""

from shoal.admin.app import Health, admin_app
from shoal.admin.app import serving as serving_admin
from shoal.admin.auth import AdminToken, load_or_create_token

__all__ = ["AdminToken", "Health", "admin_app", "load_or_create_token", "serving_admin"]
