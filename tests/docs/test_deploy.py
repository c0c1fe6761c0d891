"""docs/deploy.md and deploy/: what the guide shows is what happens.

The shipped environment file makes `check --deploy` say what the guide says; the systemd units
pass `systemd-analyze verify` and carry the keys a graceful stop needs; the nginx file passes
`nginx -t` and, in front of gunicorn with the documented settings, serves HTTPS with a working
login; the restore steps bring a backup back; pg_dump and pg_restore round-trip on PostgreSQL.
Everything runs on this machine, on loopback.
"""

from __future__ import annotations

import configparser
import os
import re
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from cryptography import x509
from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.support.agent_process import agent_env, free_port, gunicorn, manage

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "deploy.md"
DEPLOY = ROOT / "deploy"
WRAPPER = DEPLOY / "service-agent-manage"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
NGINX_SITE = DEPLOY / "nginx" / "service-agent.conf"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


# --- The guide's blocks ---------------------------------------------------------------------------


def doc_blocks(kind: str) -> list[str]:
    return [body for lang, body in FENCE.findall(DOC.read_text()) if lang == kind]


def console_sessions(command: str) -> list[tuple[str, int]]:
    """(output, exit status) of each `$ command` in the guide's console blocks."""
    found = []
    for body in doc_blocks("console"):
        lines = body.splitlines()
        for index, line in enumerate(lines):
            if line == f"$ {command}":
                output = []
                for following in lines[index + 1 :]:
                    status = re.fullmatch(r"\(exit (\d+)\)", following)
                    if status:
                        found.append(("\n".join(output), int(status.group(1))))
                        break
                    output.append(following)
    return found


def bash_block(containing: str) -> list[str]:
    blocks = [body for body in doc_blocks("bash") if containing in body]
    assert len(blocks) == 1, f"docs/deploy.md: one bash block with {containing!r}"
    return blocks[0].splitlines()


# --- The documented environment, on this machine ------------------------------------------------


def documented_env_file(tmp_path: Path, **changes: str) -> Path:
    """deploy/service-agent.env with both secrets generated (as section 2 says) and the data
    directory under tmp_path; `changes` replace or (empty string) blank a variable."""
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    values = {
        "SECRET_KEY": secrets.token_urlsafe(50),
        "FIELD_ENCRYPTION_KEYS": Fernet.generate_key().decode(),
        **changes,
    }
    lines = []
    for line in (DEPLOY / "service-agent.env").read_text().splitlines():
        name = line.split("=", 1)[0]
        if not line.startswith("#") and "=" in line and name in values:
            line = f"{name}={values.pop(name)}"
        lines.append(line.replace("/var/lib/service-agent", str(data)))
    lines += [f"{name}={value}" for name, value in values.items()]
    path = tmp_path / "env"
    path.write_text("\n".join(lines) + "\n")
    return path


def env_values(path: Path) -> dict[str, str]:
    return dict(
        line.split("=", 1)
        for line in path.read_text().splitlines()
        if line and not line.startswith("#") and "=" in line
    )


def clean_environ() -> dict[str, str]:
    """This process's environment without the test settings, as a login shell's would be."""
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DJANGO_", "PYTEST", "SECURE_", "SESSION_", "CSRF_"))
        and key
        not in (
            *("DATABASE_URL", "DATABASE_POOLER", "DATABASE_DIRECT_URL"),
            *("SECRET_KEY", "SECRET_KEY_FILE", "DATA_DIR", "EGRESS_ALLOWLIST"),
        )
    }


def run_wrapper(env_file: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`service-agent-manage ARGS` with the env file of a test and this checkout's code."""
    env = {**clean_environ(), "SERVICE_AGENT_ENV": str(env_file), "SERVICE_AGENT_DIR": str(ROOT)}
    return subprocess.run([str(WRAPPER), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


# --- check --deploy -------------------------------------------------------------------------------


def test_check_deploy_is_clean_with_the_documented_settings(tmp_path):
    documented = console_sessions("sudo -u service-agent service-agent-manage check --deploy")
    assert len(documented) == 2
    result = run_wrapper(documented_env_file(tmp_path), "check", "--deploy")
    assert (result.stdout + result.stderr).strip() == documented[0][0]
    assert result.returncode == documented[0][1] == 0


def test_without_a_secret_key_it_refuses_to_start_as_documented(tmp_path):
    output, status = console_sessions("sudo -u service-agent service-agent-manage check --deploy")[1]
    result = run_wrapper(documented_env_file(tmp_path, SECRET_KEY=""), "check", "--deploy")
    assert result.returncode == status == 1
    shown = result.stderr.strip().replace(str(tmp_path / "data"), "/var/lib/service-agent")
    assert shown == output


def test_without_the_https_settings_it_warns_about_each(tmp_path):
    env_file = documented_env_file(tmp_path)
    kept = [
        line
        for line in env_file.read_text().splitlines()
        if not line.startswith(("SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SECURE_"))
    ]
    env_file.write_text("\n".join(kept) + "\n")
    result = run_wrapper(env_file, "check", "--deploy")
    found = sorted(set(re.findall(r"security\.W\d+", result.stderr)))
    assert found == ["security.W004", "security.W008", "security.W012", "security.W016"]
    for code in ("W004", "W008", "W012", "W016"):
        assert code in DOC.read_text()


def test_the_wrapper_refuses_an_unreadable_env_file(tmp_path):
    result = run_wrapper(tmp_path / "missing", "check")
    assert result.returncode == 1
    assert "cannot read" in result.stderr and "sudo -u service-agent" in result.stderr


# --- systemd units --------------------------------------------------------------------------------


def _unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string(path.read_text())
    return parser


def test_the_units_name_the_environment_user_and_a_graceful_stop():
    assert [unit.name for unit in UNITS] == ["service-agent-web.service", "service-agent-workers.service"]
    for path in UNITS:
        service = _unit(path)["Service"]
        assert service["EnvironmentFile"] == "/etc/service-agent/env"
        assert service["User"] == "service-agent"
        assert service["WorkingDirectory"] == "/opt/service-agent"
        assert service["Restart"] in ("always", "on-failure")
        assert service["KillSignal"] == "SIGTERM"
        # SIGTERM to the main process only: it stops its children itself.
        assert service["KillMode"] == "mixed"
        assert "/var/lib/service-agent" in service["ReadWritePaths"]
        assert _unit(path)["Install"]["WantedBy"] == "multi-user.target"
    web = _unit(DEPLOY / "systemd" / "service-agent-web.service")["Service"]
    assert "gunicorn eventservice.wsgi:application" in web["ExecStart"]
    assert "--bind 127.0.0.1:8000" in web["ExecStart"]
    assert web["RestartPreventExitStatus"] == "4"  # eventservice/wsgi.py's exit on a bad setting
    workers = _unit(DEPLOY / "systemd" / "service-agent-workers.service")["Service"]
    assert workers["ExecStart"] == "/opt/service-agent/.venv/bin/python manage.py qcluster"
    # One attempt of at most 120 s, then the engine's 10 s drain.
    assert int(workers["TimeoutStopSec"]) >= 130


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verifies_the_units(tmp_path):
    # verify needs the ExecStart programs to exist: copies pointing at this checkout.
    copies = []
    for path in UNITS:
        copy = tmp_path / path.name
        copy.write_text(path.read_text().replace("/opt/service-agent", str(ROOT)))
        copies.append(str(copy))
    result = subprocess.run(
        ["systemd-analyze", "verify", *copies], capture_output=True, text=True, timeout=60, check=False
    )
    # verify exits 0 on keys it ignores; anything it prints is a problem.
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


# --- nginx ----------------------------------------------------------------------------------------


def test_the_nginx_site_sets_the_headers_the_settings_trust():
    site = NGINX_SITE.read_text()
    assert site.count("{") == site.count("}")
    assert "proxy_set_header X-Forwarded-Proto $scheme;" in site
    assert "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;" in site
    assert "proxy_set_header Host $host;" in site
    assert "server 127.0.0.1:8000;" in site
    assert re.search(r"listen 443 ssl", site) and "return 301 https://$host$request_uri;" in site
    env = env_values(DEPLOY / "service-agent.env")
    assert env["SECURE_PROXY_SSL_HEADER"] == "HTTP_X_FORWARDED_PROTO,https"
    assert env["TRUSTED_PROXY_COUNT"] == "1"  # nginx is the one proxy appending to X-Forwarded-For
    assert env["CSRF_TRUSTED_ORIGINS"] == f"https://{env['ALLOWED_HOSTS']}"
    assert f"server_name {env['ALLOWED_HOSTS']};" in site


def _self_signed(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        # Its own trust anchor: the test client trusts exactly this certificate.
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def _nginx_config(tmp_path: Path, *, upstream: int = 8000, http: int = 80, https: int = 443) -> Path:
    """The shipped site with a test certificate (and, to run it, loopback ports), in a main
    configuration of its own."""
    cert, key = _self_signed(tmp_path)
    site = (
        NGINX_SITE.read_text()
        .replace("/etc/letsencrypt/live/agent.example.com/fullchain.pem", str(cert))
        .replace("/etc/letsencrypt/live/agent.example.com/privkey.pem", str(key))
        .replace("root /var/www/html;", f"root {tmp_path};")
    )
    if (upstream, http, https) != (8000, 80, 443):
        site = site.replace("agent.example.com", "localhost").replace("127.0.0.1:8000", f"127.0.0.1:{upstream}")
        site = re.sub(r"\n\s*listen \[::\]:\d+[^;]*;", "", site)  # loopback IPv4 only
        site = site.replace("listen 80;", f"listen 127.0.0.1:{http};").replace(
            "listen 443 ssl", f"listen 127.0.0.1:{https} ssl"
        )
    (tmp_path / "site.conf").write_text(site)
    (tmp_path / "logs").mkdir(exist_ok=True)
    user = "user root root;\n" if os.geteuid() == 0 else ""
    main = tmp_path / "nginx.conf"
    main.write_text(
        f"{user}pid {tmp_path}/nginx.pid;\nerror_log {tmp_path}/logs/error.log;\nevents {{}}\n"
        f"http {{\n  access_log {tmp_path}/logs/access.log;\n  include {tmp_path}/site.conf;\n}}\n"
    )
    return main


NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
needs_nginx = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx-light)")


@needs_nginx
def test_nginx_accepts_the_site(tmp_path):
    main = _nginx_config(tmp_path)
    result = subprocess.run(
        [NGINX, "-t", "-p", str(tmp_path), "-c", str(main)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "test is successful" in result.stderr
    assert "[emerg]" not in result.stderr and "[error]" not in result.stderr


def _session() -> requests.Session:
    """A client that takes no CA bundle or proxy from the environment: loopback, our certificate."""
    session = requests.Session()
    session.trust_env = False
    return session


@contextmanager
def _nginx(main: Path, prefix: Path, port: int):
    proc = subprocess.Popen(
        [NGINX, "-p", str(prefix), "-c", str(main), "-g", "daemon off;"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                _session().get(f"http://127.0.0.1:{port}/", timeout=1, allow_redirects=False)
                break
            except requests.ConnectionError:
                assert proc.poll() is None, proc.stderr.read().decode()
                assert time.monotonic() < deadline, "nginx did not start"
                time.sleep(0.05)
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


@needs_nginx
def test_behind_the_shipped_nginx_the_documented_settings_serve_https(tmp_path):
    http_port, https_port = free_port(), free_port()
    origin = f"https://localhost:{https_port}"
    env_file = documented_env_file(
        tmp_path,
        ALLOWED_HOSTS="localhost",
        CSRF_TRUSTED_ORIGINS=origin,
        AGENT_BASE_URL=origin,
    )
    assert run_wrapper(env_file, "migrate", "--noinput", "-v0").returncode == 0
    made = run_wrapper(env_file, "create_user", "opal", "--generate-password", "--operator")
    assert made.returncode == 0, made.stderr
    password = made.stdout.splitlines()[-1]
    env = agent_env(tmp_path / "data", **env_values(env_file))
    with gunicorn(env) as web_port:
        main = _nginx_config(tmp_path, upstream=web_port, http=http_port, https=https_port)
        with _nginx(main, tmp_path, http_port):
            cert = str(tmp_path / "cert.pem")
            plain = _session().get(f"http://127.0.0.1:{http_port}/login/", allow_redirects=False, timeout=10)
            assert plain.status_code == 301
            assert plain.headers["Location"].startswith("https://")

            browser = _session()
            browser.verify = cert
            page = browser.get(f"{origin}/login/", timeout=10)
            # Django sees HTTPS through X-Forwarded-Proto: no redirect loop, HSTS sent, secure cookies.
            assert page.status_code == 200 and not page.history
            assert page.headers["Strict-Transport-Security"].startswith("max-age=31536000")
            assert all(cookie.secure for cookie in browser.cookies)
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)

            # A failed login, claiming another address: the lockout counts the real client.
            browser.post(
                f"{origin}/login/",
                data={"csrfmiddlewaretoken": token, "username": "opal", "password": "wrong-password"},
                headers={"Referer": f"{origin}/login/", "X-Forwarded-For": "203.0.113.9"},
                timeout=10,
            )
            with sqlite3.connect(tmp_path / "data" / "event_service.db") as db:
                addresses = {row[0] for row in db.execute("SELECT ip_address FROM axes_accessattempt")}
            assert addresses == {"127.0.0.1"}

            # The login passes the CSRF origin check (CSRF_TRUSTED_ORIGINS) and lands in the app.
            token = browser.cookies["csrftoken"]
            login = browser.post(
                f"{origin}/login/",
                data={"csrfmiddlewaretoken": token, "username": "opal", "password": password},
                headers={"Referer": f"{origin}/login/"},
                allow_redirects=False,
                timeout=10,
            )
            assert login.status_code == 302, login.text[:500]
            admin = browser.get(f"{origin}/admin/", timeout=10)
            assert admin.status_code == 200 and "Service Agent administration" in admin.text

            assert browser.get(f"{origin}/metrics", timeout=10).status_code == 404


# --- Backup and restore ---------------------------------------------------------------------------


def _substituted(line: str, *, data: Path, backups: Path) -> str:
    line = line.replace("/var/lib/service-agent", str(data)).replace("/var/backups/service-agent", str(backups))
    line = line.replace("sudo -u service-agent ", "")
    return re.sub(r"(?<![\w/-])service-agent-manage\b", str(WRAPPER), line)


def test_the_documented_restore_brings_the_backup_back(tmp_path):
    env_file = documented_env_file(tmp_path)
    data, backups = tmp_path / "data", tmp_path / "backups"
    backups.mkdir()
    for args in (
        ("migrate", "--noinput", "-v0"),
        ("create_tenant", "acme"),
        ("submit_call", "--tenant", "acme", "--name", "before the backup", "--method", "GET"),
    ):
        args = (*args, "--url", "https://example.com/report", "--in", "1h") if args[0] == "submit_call" else args
        assert run_wrapper(env_file, *args).returncode == 0

    # The backup, exactly as the guide shows it.
    backup_line = next(
        line for body in doc_blocks("console") for line in body.splitlines() if " backup " in line and "2026" in line
    )
    command = _substituted(backup_line.removeprefix("$ "), data=data, backups=backups)
    env = {**clean_environ(), "SERVICE_AGENT_ENV": str(env_file), "SERVICE_AGENT_DIR": str(ROOT)}
    made = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert made.returncode == 0, made.stderr
    assert re.fullmatch(
        rf"Backed up {data}/event_service.db to {backups}/agent-20261122T023000Z.sqlite3 \([\d,]+ bytes; integrity check ok\)\.\n",
        made.stdout,
    )

    # Later work, which the restore undoes; the workers were never started, so a -wal is there.
    later = run_wrapper(
        env_file,
        *("submit_call", "--tenant", "acme", "--name", "after the backup", "--method", "GET"),
        *("--url", "https://example.com/late", "--in", "1h"),
    )
    assert later.returncode == 0

    steps = [
        _substituted(line, data=data, backups=backups)
        for line in bash_block("rm -f event_service.db")
        if not line.startswith("sudo systemctl")
    ]
    assert not any("sudo" in step for step in steps), steps
    script = "set -euo pipefail\n" + "\n".join(steps) + "\n"
    restored = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert "System check identified no issues" in restored.stdout

    listed = run_wrapper(env_file, "list_calls", "--tenant", "acme", "--json")
    assert listed.returncode == 0, listed.stderr
    assert re.findall(r'"name": "([^"]+)"', listed.stdout) == ["before the backup"]
    # What was there before the restore was kept, the later call included.
    with sqlite3.connect(backups / "before-restore.sqlite3") as kept:
        names = sorted(row[0] for row in kept.execute("SELECT name FROM service_calls"))
    assert names == ["after the backup", "before the backup"]


def _postgres_url(settings_dict: dict, name: str) -> str:
    user = settings_dict.get("USER") or ""
    password = f":{settings_dict['PASSWORD']}" if settings_dict.get("PASSWORD") else ""
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = settings_dict.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{name}"


def _direct_url(settings_dict: dict, name: str) -> str | None:
    """`name` on PostgreSQL itself when the tests run behind PgBouncer (DATABASE_DIRECT_URL, as
    scripts/test's pass through it sets it); None when they reach PostgreSQL directly."""
    direct = os.environ.get("DATABASE_DIRECT_URL", "")
    return direct.rsplit("/", 1)[0] + f"/{name}" if direct else None


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_documented_pg_dump_and_pg_restore_round_trip(tmp_path):
    from django.db import connection

    from tests.support.factories import HOUR, make_call, make_tenant

    for program in ("pg_dump", "pg_restore"):
        if shutil.which(program) is None:
            pytest.skip(f"{program} is not installed (apt-get install postgresql-client)")
    make_tenant("acme")
    make_call("acme", name="dumped", due_in=HOUR)
    scratch = f"restore_{secrets.token_hex(4)}"
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{scratch}"')
    try:
        dump = tmp_path / "agent-20261122T023000Z.dump"
        lines = {
            line.split()[0]: line for body in doc_blocks("bash") for line in body.splitlines() if line.startswith("pg_")
        }
        for program, name in (("pg_dump", connection.settings_dict["NAME"]), ("pg_restore", scratch)):
            command = lines[program].replace("/var/backups/service-agent", str(tmp_path))
            # The agent's environment; behind PgBouncer, with the direct URL the commands take.
            env = {**clean_environ(), "DATABASE_URL": _postgres_url(connection.settings_dict, name)}
            if direct := _direct_url(connection.settings_dict, name):
                env["DATABASE_DIRECT_URL"] = direct
            result = subprocess.run(
                ["bash", "-c", command],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert result.returncode == 0, result.stderr
        assert dump.stat().st_size > 0
        check = subprocess.run(
            ["psql", _postgres_url(connection.settings_dict, scratch), "-At", "-c", "SELECT name FROM service_calls"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert check.stdout.split() == ["dumped"]
    finally:
        with connection.cursor() as cursor:
            # FORCE: behind PgBouncer, its idle server connections to the copy are still there.
            cursor.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_documented_recovery_of_an_interrupted_index_build(tmp_path):
    """An upgrade to delivery 0003 whose migrate command is killed while its concurrent index
    build waits for a transaction older than it: the build goes on running on the server, the
    column and an invalid index are left, and `migrate` stops on them; the guide's steps, in
    its order, bring the upgrade through."""
    import psycopg
    from django.db import connection

    scratch = f"upgrade_{secrets.token_hex(4)}"
    url = _postgres_url(connection.settings_dict, scratch)
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{scratch}"')
    env = agent_env(tmp_path, DATABASE_URL=url, SECRET_KEY="k" * 50)

    def ask(sql: str) -> list[tuple]:
        with psycopg.connect(url, autocommit=True) as conn:
            return conn.execute(sql).fetchall()

    def builds() -> list[tuple]:
        return ask(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE 'CREATE INDEX CONCURRENTLY%' "
            "AND wait_event_type = 'Lock' AND datname = current_database()"
        )

    def column_and_index() -> list[tuple]:
        return ask(
            "SELECT 'column' FROM information_schema.columns WHERE table_name = 'event_notifications' "
            "AND column_name = 'claimed_by' UNION ALL "
            "SELECT 'index' FROM pg_class WHERE relname = 'event_notifications_claimed'"
        )

    def run_psql(line: str) -> None:
        assert line.startswith("sudo -u postgres psql service_agent -c ")
        command = line.replace("sudo -u postgres psql service_agent ", f"psql {url} ", 1)
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr

    try:
        assert manage(env, "migrate", "delivery", "0002").returncode == 0
        # A long read (a report, a backup) that holds its snapshot: the build waits for it at
        # its end, after the column is added; a write to the table would hold the column too.
        with psycopg.connect(url) as holder:
            holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            holder.execute("SELECT count(*) FROM django_migrations")
            upgrade = subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), "migrate", "delivery", "0003"],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                deadline = time.monotonic() + 30
                while not builds() and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert builds(), "the build never waited for the open transaction"
            finally:
                upgrade.kill()  # the migrate command killed
                upgrade.wait(10)
            time.sleep(0.5)
            assert builds(), "the server stopped the build when its client went"

            [check] = bash_block("showmigrations delivery")
            assert check == "sudo -u service-agent service-agent-manage showmigrations delivery"
            shown = manage(env, "showmigrations", "delivery")
            assert " [ ] 0003_claimed_by" in shown.stdout, shown.stdout + shown.stderr

            steps = bash_block("DROP INDEX CONCURRENTLY")
            assert len(steps) == 4 and "DROP INDEX CONCURRENTLY IF EXISTS" in steps[1], steps
            run_psql(steps[0])  # the build cancelled
            deadline = time.monotonic() + 10
            while builds() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not builds()
            holder.rollback()  # the long read ends
        assert ask(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = 'event_notifications_claimed'"
        ) == [(False,)]
        assert ask("SELECT count(*) FROM django_migrations WHERE app = 'delivery' AND name = '0003_claimed_by'") == [
            (0,)
        ]
        again = manage(env, "migrate")
        assert again.returncode != 0 and "claimed_by" in again.stderr  # why the guide's steps

        for line, left in zip(steps[1:3], ([("column",)], []), strict=True):
            run_psql(line)
            assert column_and_index() == left  # the index first, then the column
        assert steps[3] == "sudo -u service-agent service-agent-manage migrate"
        assert manage(env, "migrate").returncode == 0
        assert ask(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = 'event_notifications_claimed'"
        ) == [(True,)]
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')


def test_every_command_of_the_guide_runs_somewhere():
    """The commands this file cannot run (installing packages, systemctl, sudo) are listed in the
    report of the change; the others are run above. A new command in a block must be added to
    one of the two lists."""
    run_here = (
        "sudo -u service-agent service-agent-manage check --deploy",
        "sudo -u service-agent service-agent-manage backup",
        "sudo -u service-agent service-agent-manage migrate",
        "sudo -u service-agent service-agent-manage showmigrations delivery",
        'sudo -u postgres psql service_agent -c "SELECT pg_cancel_backend(pid)',
        "sudo -u postgres psql service_agent -c 'DROP INDEX CONCURRENTLY",
        "sudo -u postgres psql service_agent -c 'ALTER TABLE event_notifications DROP COLUMN",
        "sudo -u service-agent rm -f",
        "sudo -u service-agent cp",
        "sudo -u service-agent service-agent-manage check --database default",
        "cd /var/lib/service-agent",
        "pg_dump -Fc",
        "pg_restore --clean",
        # tests/commands/test_copy_to_postgres.py runs it on a real agent.
        "sudo -u service-agent service-agent-manage copy_to_postgres",
        # tests/workers/test_postgres_failover.py makes its standby so (tests/support/
        # postgres_servers.py), and promotes it with pg_promote().
        "sudo -u postgres pg_basebackup",
    )
    by_hand = (
        "git archive",
        "sudo apt-get install",
        "sudo useradd",
        "sudo tar -xzf",
        "cd /opt/service-agent",
        "sudo python3 -m venv",
        "sudo .venv/bin/pip install",
        "sudo install ",
        "sudo -u service-agent service-agent-manage collectstatic",
        "sudo -u service-agent service-agent-manage create_operator_group",
        "sudo -u service-agent service-agent-manage createsuperuser",
        "sudo systemctl",
        "systemctl status",
        "journalctl",
        "sudo ln -s",
        "sudo nginx -t",
        "sudo -u postgres psql",
    )
    commands = [line for body in doc_blocks("bash") for line in body.splitlines() if line.strip()]
    commands += [line[2:] for body in doc_blocks("console") for line in body.splitlines() if line.startswith("$ ")]
    unknown = [line for line in commands if not line.startswith(run_here + by_hand)]
    assert not unknown, f"docs/deploy.md: commands no list knows: {unknown}"


# --- Connections: PgBouncer -----------------------------------------------------------------------

PGBOUNCER_INI = DEPLOY / "pgbouncer.ini"
PGBOUNCER_SCRIPT = ROOT / "scripts" / "pgbouncer.py"
PGBOUNCER = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None)


def _pgbouncer_ini() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, comment_prefixes=(";",), strict=True)
    parser.read_string(PGBOUNCER_INI.read_text())
    return parser


def _documented_pgbouncer_env() -> dict[str, str]:
    """The environment lines the guide gives for the agent behind PgBouncer."""
    [block] = [body for lang, body in FENCE.findall(DOC.read_text()) if not lang and "DATABASE_POOLER=" in body]
    return dict(line.split("=", 1) for line in block.splitlines())


def test_the_shipped_pgbouncer_pools_by_transaction_where_the_guide_points_the_agent():
    from urllib.parse import urlsplit

    ini = _pgbouncer_ini()
    assert ini["pgbouncer"]["pool_mode"] == "transaction"
    assert ini["pgbouncer"]["server_reset_query"] == ""  # no session state to reset
    env = _documented_pgbouncer_env()
    assert set(env) == {"DATABASE_URL", "DATABASE_POOLER", "DATABASE_DIRECT_URL"}
    assert env["DATABASE_POOLER"] == "pgbouncer"
    bouncer, direct = urlsplit(env["DATABASE_URL"]), urlsplit(env["DATABASE_DIRECT_URL"])
    # The agent reaches the file's PgBouncer, on the database host, for its database...
    assert bouncer.port == int(ini["pgbouncer"]["listen_port"]) == 6432
    assert bouncer.path.lstrip("/") in ini["databases"]
    assert f"dbname={bouncer.path.lstrip('/')}" in ini["databases"][bouncer.path.lstrip("/")]
    # ... and its direct URL the server itself, on the same host.
    assert (direct.hostname, direct.port, direct.path) == (bouncer.hostname, 5432, bouncer.path)
    # The file's own header says the same.
    for name, value in env.items():
        assert f";;   {name}={value}" in PGBOUNCER_INI.read_text()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(PGBOUNCER is None, reason="pgbouncer is not installed (apt-get install pgbouncer)")
def test_the_agent_runs_behind_the_shipped_pgbouncer_as_documented(tmp_path):
    from django.db import connection

    from tests.support.factories import make_tenant
    from tests.workers.cluster import direct_database_url

    make_tenant("acme")
    direct = direct_database_url()
    server = direct.rsplit("/", 1)[0].rsplit("@", 1)[1]
    # Under /tmp itself: run as root, PgBouncer runs as postgres, which must reach its files.
    bouncer_dir = Path(tempfile.mkdtemp(prefix="pgbouncer-test-"))
    started = subprocess.run(
        [sys.executable, str(PGBOUNCER_SCRIPT), "start", str(bouncer_dir), "--upstream", server],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert started.returncode == 0, started.stderr
    port = int(started.stdout)
    try:
        name = connection.settings_dict["NAME"]
        documented = _documented_pgbouncer_env()
        env = agent_env(
            tmp_path,
            DATABASE_URL=f"{direct.rsplit('@', 1)[0]}@127.0.0.1:{port}/{name}",
            DATABASE_POOLER=documented["DATABASE_POOLER"],
            DATABASE_DIRECT_URL=direct,
        )
        made = manage(
            env,
            "submit_call",
            "--tenant",
            "acme",
            "--name",
            "through pgbouncer",
            "--method",
            "GET",
            "--url",
            "https://example.com/report",
            "--in",
            "1h",
        )
        assert made.returncode == 0, made.stderr
        listed = manage(env, "list_calls", "--tenant", "acme", "--json")
        assert listed.returncode == 0, listed.stderr
        assert re.findall(r'"name": "([^"]+)"', listed.stdout) == ["through pgbouncer"]
        # Both went through this PgBouncer, to the test database.
        assert f"login attempt: db={name}" in (bouncer_dir / "pgbouncer.log").read_text()
    finally:
        subprocess.run([sys.executable, str(PGBOUNCER_SCRIPT), "stop", str(bouncer_dir)], timeout=30, check=False)
        shutil.rmtree(bouncer_dir, ignore_errors=True)


def _connections_section() -> str:
    text = DOC.read_text()
    start = text.index("### Connections")
    return text[start : text.index("\n## ", start)]


def test_the_guides_connection_counts_are_the_shipped_settings():
    from eventservice.database import DB_POOL_SIZE_DEFAULT, ENGINE_DB_CONNECTIONS

    section = _connections_section()
    unit = _unit(DEPLOY / "systemd" / "service-agent-web.service")["Service"]["ExecStart"]
    workers = int(re.search(r"--workers (\d+)", unit).group(1))
    q_workers = int(env_values(DEPLOY / "service-agent.env")["Q_WORKERS"])
    web = workers * DB_POOL_SIZE_DEFAULT
    # Each worker process's pool and its wake-ups' listener; the sentinel, the pusher (and its
    # listener), the monitor.
    cluster = q_workers * (ENGINE_DB_CONNECTIONS + 1) + 4
    assert f"one web host holds {workers} × {DB_POOL_SIZE_DEFAULT} = {web}" in section
    assert f"each\ncluster {q_workers} × ({ENGINE_DB_CONNECTIONS} + 1) + 4 = {cluster}" in section
    assert f"({web} + {2 * cluster} = {web + 2 * cluster})" in section
    assert f"a third cluster ({web + 3 * cluster}) does not" in section
    assert 100 - 3 - 10 == 87 and web + 2 * cluster <= 87 < web + 3 * cluster
    assert f"| `DB_POOL_SIZE` ({DB_POOL_SIZE_DEFAULT}) |" in section
    assert f"| `WORKER_DB_POOL_SIZE` ({ENGINE_DB_CONNECTIONS}) + 1 |" in section


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_guides_show_statements_give_the_servers_numbers():
    from django.db import connection

    shown = re.findall(r"`(SHOW \w+;)`", _connections_section())
    assert shown == ["SHOW max_connections;", "SHOW superuser_reserved_connections;"]
    with connection.cursor() as cursor:
        for statement in shown:
            cursor.execute(statement.rstrip(";"))
            assert int(cursor.fetchone()[0]) >= 0
