"""Run the veloxd daemon under the OS service manager: a launchd LaunchAgent on macOS, a systemd user unit on Linux."""
