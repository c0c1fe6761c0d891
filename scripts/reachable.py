"""Exit 0 if a server answers: `reachable.py postgres URL` or `reachable.py redis URL`."""

import sys


def main() -> int:
    kind, url = sys.argv[1], sys.argv[2]
    try:
        if kind == "postgres":
            import psycopg

            dsn = url.replace("postgres://", "postgresql://", 1)
            base = dsn.rsplit("/", 1)[0] + "/postgres"
            with psycopg.connect(base, connect_timeout=3):
                return 0
        if kind == "redis":
            import redis

            redis.Redis.from_url(url, socket_connect_timeout=2).ping()
            return 0
    except Exception as exc:  # any failure means "not reachable"
        print(f"{kind} not reachable at {url}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
