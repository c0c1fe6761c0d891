"""Settings of the POST floor's gunicorn (bench/floor.py): the project's, but its URLconf is
bench.floor (the project's URLs plus the floor view). Everything else, middleware and database
included, is the project's, read from the same environment."""

from eventservice.settings import *  # noqa: F403

ROOT_URLCONF = "bench.floor"
