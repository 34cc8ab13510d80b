import pytest

from tillerman.ledger.command_patterns import DEFAULT, CommandPatterns, classify


@pytest.mark.parametrize(("command", "critical", "external"), [
    ("git push origin main", True, True),
    ("/bin/bash -lc 'git push --force origin release'", True, True),
    ("npm publish --access public", True, True),
    ("twine upload dist/*", True, True),
    ("cargo publish", True, True),
    ("terraform apply -auto-approve", True, True),
    ("kubectl apply -f deploy/prod.yaml", True, True),
    ("kubectl delete pod web-1", True, True),
    ("fly deploy", True, True),
    ("python manage.py migrate", True, False),
    ("alembic upgrade head", True, False),
    ("psql -c 'DROP DATABASE shop'", True, False),
    ("curl -X POST https://api.stripe.com/v1/charges -d amount=100", True, True),
    ("curl -X DELETE https://api.example.com/v1/items/3", False, True),
    ("curl --request PUT https://example.com/x", False, True),
    ("curl -d '{}' https://hooks.example.com", False, True),
    ("scp build.tgz prod:/srv/", False, True),
    ("gh pr create --fill", False, True),
    ("curl https://example.com", False, False),
    ("git status", False, False),
    ("git pushd", False, False),
    ("pytest -q", False, False),
    ("ls -la", False, False),
])
def test_default_patterns(command, critical, external):
    assert classify(command) == (critical, external)


def test_configured_patterns_replace_the_defaults():
    patterns = CommandPatterns(critical=(r"\bmake\s+release\b",), external=())
    assert patterns.classify("make release") == (True, False)
    assert patterns.classify("git push") == (False, False)
    assert classify("git push", patterns) == (False, False)
    assert DEFAULT.classify("make release") == (False, False)


def test_patterns_are_case_insensitive_and_hashable():
    assert DEFAULT.classify("GIT PUSH") == (True, True)
    assert hash(DEFAULT) == hash(CommandPatterns(DEFAULT.critical, DEFAULT.external))


def test_classification_is_remembered_per_command_line_within_a_bound():
    from tillerman.ledger.command_patterns import _REMEMBERED, CommandPatterns

    patterns = CommandPatterns(critical=(r"\bdeploy\b",), external=())
    assert patterns.classify("make deploy") == (True, False)
    assert patterns.classify("make deploy") == (True, False)  # from memory
    for i in range(_REMEMBERED + 10):
        patterns.classify(f"echo {i}")
    assert len(patterns._classified) <= _REMEMBERED
    assert patterns.classify("make deploy") == (True, False)
