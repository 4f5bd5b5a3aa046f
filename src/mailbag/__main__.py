from mailbag.cli import app

app(prog_name="mailbag")
