# The live fault tests share the live tests' real app-server and scripted model.
from tests.live.conftest import anyio_backend, app_server, scripted_model, workspace  # noqa: F401
