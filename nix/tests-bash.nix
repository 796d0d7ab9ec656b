# Wiring checks of bash-unit.nix (the bash-task daemon's unit), run by
# tests/nix.rs:
#   nix-instantiate --eval --strict --json nix/tests-bash.nix
# evaluates to the list of failures. module.nix is evaluated with the stub lib
# and pkgs (nix/stub.nix); the module system's merge of the two modules'
# definitions of hyperhive-agent is done here by hand (lists appended,
# attribute sets merged), as NixOS does it.
let
  env = import ./env.nix;
  inherit (import ./stub.nix) lib pkgs drv;

  check = name: got: want:
    if got == want then [ ] else [ "${name}: got ${builtins.toJSON got}, want ${builtins.toJSON want}" ];

  agentCfg = over: env.defaults // {
    enable = true;
    label = "ana";
    parent = null;
    package = drv "hive";
    stateDir = "/var/lib/hyperhive/ana";
    extraPackages = [ pkgs.claude-code ];
    user = { name = "hive-ana"; uid = 1001; gid = 1001; passwordlessSudo = false; };
  } // over;

  eval = cfg:
    let
      m = import ./module.nix { inherit lib pkgs; config.hyperhive = cfg; };
      own = m.config.systemd.services.hyperhive-agent;
      b = import ./bash-unit.nix {
        inherit lib;
        config = { hyperhive = cfg; systemd.services.hyperhive-agent = merged; };
      };
      add = b.config.systemd.services.hyperhive-agent;
      merged = own // {
        wants = own.wants ++ add.wants;
        after = own.after ++ add.after;
        unitConfig = add.unitConfig;
        environment = own.environment // add.environment;
      };
    in
    { inherit (m) imports; agent = merged; bash = b.config.systemd.services.hyperhive-bash; };

  e = eval (agentCfg { });
  off = import ./bash-unit.nix { inherit lib; config.hyperhive = agentCfg { enable = false; }; };
in
check "module.nix imports the unit" e.imports [ ./bash-unit.nix ]
++ check "agent wants and orders after it" [ e.agent.wants e.agent.after ] [
  [ "network-online.target" "hyperhive-bash.service" ]
  [ "network-online.target" "hyperhive-bash.service" ]
]
++ check "one /tmp" e.agent.unitConfig.JoinsNamespaceOf "hyperhive-bash.service"
++ check "harness starts no daemon" e.agent.environment.HIVE_BASH_DAEMON "external"
++ check "daemon exec" e.bash.serviceConfig.ExecStart
  "/nix/store/stub-hive/bin/hive bash-daemon --state-dir /var/lib/hyperhive/ana"
++ check "the agent's user and dir" [ e.bash.serviceConfig.User e.bash.serviceConfig.Group e.bash.serviceConfig.WorkingDirectory ]
  [ "hive-ana" "hive-ana" "/var/lib/hyperhive/ana" ]
++ check "the agent's environment, but the placement" e.bash.environment
  (builtins.removeAttrs e.agent.environment [ "HIVE_BASH_DAEMON" ])
++ check "the same socket" e.bash.environment.HIVE_BASH_SOCKET "/run/hive-bash/socket"
++ check "the agent's PATH" (map (p: p.name) e.bash.path) [ "bash" "coreutils" "git" "claude-code" ]
++ check "its runtime dir holds the socket" [ e.bash.serviceConfig.RuntimeDirectory e.agent.serviceConfig.RuntimeDirectory ]
  [ [ "hive-bash" ] [ "hyperhive-agent" ] ]
++ check "same hardening" [ e.bash.serviceConfig.PrivateTmp e.bash.serviceConfig.NoNewPrivileges e.bash.serviceConfig.RestrictAddressFamilies ]
  [ e.agent.serviceConfig.PrivateTmp e.agent.serviceConfig.NoNewPrivileges e.agent.serviceConfig.RestrictAddressFamilies ]
++ check "restarted, stopped with its tasks" [ e.bash.serviceConfig.Restart e.bash.serviceConfig.KillMode ] [ "always" "mixed" ]
++ check "disabled agent, no unit" off.config { }
