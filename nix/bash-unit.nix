# The agent's bash-task daemon as a unit of its own (imported by module.nix):
# `hyperhive-bash.service` runs `hive bash-daemon` as the agent's user, with
# the agent unit's environment, PATH and working directory, so background tasks
# (mcp__bash__run) see what the agent sees and outlive a restart, an update or
# a crash of `hyperhive-agent.service`, which wants it, joins its private /tmp
# and starts no daemon of its own (HIVE_BASH_DAEMON=external). Stopping this
# unit kills the tasks and records them `interrupted`. The socket is in this
# unit's runtime dir (/run/hive-bash, HIVE_BASH_SOCKET's default). Checked by
# nix/tests-bash.nix. docs/deploy.md describes it.
{ config, lib, ... }:

let
  cfg = config.hyperhive;
  agent = config.systemd.services.hyperhive-agent;
in
{
  config = lib.mkIf cfg.enable {
    systemd.services.hyperhive-agent = {
      wants = [ "hyperhive-bash.service" ];
      after = [ "hyperhive-bash.service" ];
      unitConfig.JoinsNamespaceOf = "hyperhive-bash.service";
      environment.HIVE_BASH_DAEMON = "external";
    };

    systemd.services.hyperhive-bash = {
      description = "hive agent ${cfg.label}'s bash-task daemon (hive bash-daemon)";
      wantedBy = [ "multi-user.target" ];
      inherit (agent) path;
      # The agent's variables (PATH comes from `path`, as for the agent).
      environment = builtins.removeAttrs agent.environment [ "HIVE_BASH_DAEMON" "PATH" ];
      serviceConfig = {
        ExecStart = "${cfg.package}/bin/hive bash-daemon --state-dir ${cfg.stateDir}";
        User = cfg.user.name;
        Group = cfg.user.name;
        RuntimeDirectory = [ "hive-bash" ];
        WorkingDirectory = cfg.stateDir;
        Restart = "always";
        RestartSec = 2;
        # SIGTERM lets the daemon kill its tasks' process groups and record
        # them; the rest of the cgroup is killed after that.
        KillMode = "mixed";
        TimeoutStopSec = 30;
        LimitNOFILE = 65536;
        inherit (agent.serviceConfig)
          NoNewPrivileges PrivateTmp ProtectKernelModules ProtectKernelTunables
          ProtectControlGroups RestrictAddressFamilies LockPersonality;
      };
    };
  };
}
