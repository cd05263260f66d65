"""One router per resource; :func:`trimtab.api.app.create_app` mounts them all."""
