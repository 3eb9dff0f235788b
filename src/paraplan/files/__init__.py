"""The user's files: the checks before writing one, atomic writes (``files.atomic``) and the
checks before drawing a picture (``files.pictures``). Nothing here imports matplotlib until a
picture is checked or drawn."""
