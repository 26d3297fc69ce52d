from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "testproject.demo"
    label = "demo"

    def ready(self) -> None:
        # The flow control tests' planted faults (none unless asked for).
        from .faults import plant_from_environment

        plant_from_environment()
