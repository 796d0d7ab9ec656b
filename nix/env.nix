# The pure half of the hyperhive NixOS modules: option values in, environment
# variables, JSON files and assertion messages out. Uses builtins only (no
# nixpkgs), so CI evaluates it with `nix-instantiate --eval --strict
# nix/tests.nix`. module.nix and host.nix call these functions; docs/deploy.md
# lists every option and the variable it sets.
let
  inherit (builtins)
    all any concatStringsSep elem filter head isString length map match split
    toJSON attrNames;

  boolStr = b: if b then "true" else "false";
  commaList = concatStringsSep ",";
  segments = s: filter isString (split "/" s);
in
rec {
  # Defaults of the per-agent options (`hyperhive.*`), as module.nix declares them.
  defaults = {
    label = "hive";
    model = null;
    autoCompact = true;
    icon = null;
    dashboardLinks = [ ];
    staticDir = null; # the merged frontend.extraFiles tree, when there is one
    frontend = { dist = null; extraFiles = { }; };
    forge.url = "http://localhost:3000";
    matrix.url = "http://localhost:8008";
    claudeMarketplaces = [ "anthropics/claude-plugins-official" ];
    claudePlugins = [ ];
    claudePluginsAutoUpdate = false;
    cargo.shortMessages = true;
    toolGroups = [ "messaging" "meta" "inbox" "execution" ];
    allowedRecipients = [ ];
    socket = "/run/hive/mcp.sock";
    bashSocket = "/run/hive-bash/socket";
    web = { port = 7700; bind = "127.0.0.1"; };
    extraEnv = { };
  };

  # Paths the web UI answers itself or the default dist holds: an extra file
  # may not be placed on them.
  reservedTargets = [ "index.html" "static" "api" "events" "login" "icon" "metrics" ];

  # http:// or https:// followed by something without spaces, or "".
  validUrl = s: s == "" || match "https?://[^[:space:]]+" s != null;

  # frontend.extraFiles target names.
  targetProblem = reserved: t:
    if match "[A-Za-z0-9_].*" t == null then
      "must start with a letter, a digit or _"
    else if match "[A-Za-z0-9_./-]*" t == null then
      "may only contain letters, digits, _ . / -"
    else if elem ".." (segments t) then
      "may not contain a .. segment"
    else if elem (head (segments t)) reserved then
      "collides with ${head (segments t)} of the default dist"
    else
      null;
  validTarget = reserved: t: targetProblem reserved t == null;

  # The resolved target of one frontend.extraFiles entry.
  targetOf = name: entry: if (entry.target or null) != null then entry.target else name;

  # The hive label must be a broker agent name.
  validLabel = l: match "[a-z0-9-]{1,9}" l != null;

  # [ { assertion; message; } ] for one agent's options, NixOS style.
  assertions = cfg:
    let
      reserved = reservedTargets ++ (cfg.distEntries or [ ]);
      extra = cfg.frontend.extraFiles;
    in
    [
      {
        assertion = validUrl cfg.forge.url;
        message = "hyperhive.forge.url must be an http:// or https:// URL or \"\", got \"${cfg.forge.url}\"";
      }
      {
        assertion = validUrl cfg.matrix.url;
        message = "hyperhive.matrix.url must be an http:// or https:// URL or \"\", got \"${cfg.matrix.url}\"";
      }
      {
        assertion = validLabel cfg.label;
        message = "hyperhive.label must be 1-9 characters of a-z, 0-9 and -, got \"${cfg.label}\"";
      }
    ]
    ++ map
      (name:
        let t = targetOf name extra.${name}; in {
          assertion = validTarget reserved t;
          message = "hyperhive.frontend.extraFiles.\"${name}\": target \"${t}\" ${toString (targetProblem reserved t)}";
        })
      (attrNames extra)
    ++ map
      (l: {
        assertion = l ? label && l ? url && validUrl l.url && l.url != "";
        message = "hyperhive.dashboardLinks: every link needs a label and an http(s) url, got ${toJSON l}";
      })
      cfg.dashboardLinks;

  # The messages of the failed assertions (what NixOS would print).
  failedAssertions = cfg: map (a: a.message) (filter (a: !a.assertion) (assertions cfg));

  # The environment of `hive serve` for one agent (docs/env.md, docs/web.md).
  agentEnv = cfg:
    let
      opt = cond: attrs: if cond then attrs else { };
    in
    {
      HIVE_LABEL = cfg.label;
      HIVE_SOCKET = cfg.socket;
      HIVE_BASH_SOCKET = cfg.bashSocket;
      HIVE_AUTO_COMPACT = boolStr cfg.autoCompact;
      HIVE_TOOL_GROUPS = commaList cfg.toolGroups;
      HIVE_PORT = toString cfg.web.port;
      HIVE_BIND = cfg.web.bind;
      HIVE_CLAUDE_MARKETPLACES = commaList cfg.claudeMarketplaces;
      HIVE_CLAUDE_PLUGINS = commaList cfg.claudePlugins;
      HIVE_CLAUDE_PLUGINS_AUTO_UPDATE = boolStr cfg.claudePluginsAutoUpdate;
      # Set even when "": an empty URL switches forge notifications off (unset,
      # hive would use its default URL).
      HIVE_FORGE_URL = cfg.forge.url;
    }
    // opt (cfg.model != null) { HIVE_DEFAULT_MODEL = cfg.model; }
    // opt (cfg.icon != null) { HIVE_ICON = toString cfg.icon; }
    // opt (cfg.staticDir != null) { HIVE_STATIC_DIR = toString cfg.staticDir; }
    // opt (cfg.frontend.dist != null) { HIVE_WEB_DIST = toString cfg.frontend.dist; }
    // opt (cfg.matrix.url != "") { HIVE_MATRIX_URL = cfg.matrix.url; }
    // opt cfg.cargo.shortMessages { HIVE_BASH_ENV = "/etc/hyperhive/bash-env.sh"; }
    // cfg.extraEnv;

  # `<state>/hyperhive-dashboard-links.json`.
  dashboardLinksJson = links:
    toJSON (map (l: { inherit (l) label url; icon = l.icon or ""; }) links);

  # One agent's entry of the hive config (docs/config.md) for `hive broker`.
  brokerEntry = name: a:
    { inherit name; }
    // (if (a.parent or null) != null then { inherit (a) parent; } else { })
    // (if (a.model or null) != null then { inherit (a) model; } else { })
    // (if (a.allowedRecipients or [ ]) != [ ] then { allowed_recipients = a.allowedRecipients; } else { })
    // (if a ? toolGroups then { tool_groups = a.toolGroups; } else { })
    // (if (a.capabilities or [ ]) != [ ] then { inherit (a) capabilities; } else { })
    // (if (a.socketUid or null) != null then { socket_uid = a.socketUid; } else { })
    // (if (a.socketGid or null) != null then { socket_gid = a.socketGid; } else { });

  # The hive config JSON for the host module.
  hiveConfig = { hiveName ? null, swarmName ? null, operatorGid ? null, agents }:
    toJSON (
      { agents = map (n: brokerEntry n agents.${n}) (attrNames agents); }
      // (if hiveName != null then { hive_name = hiveName; } else { })
      // (if swarmName != null then { swarm_name = swarmName; } else { })
      // (if operatorGid != null then { operator_gid = operatorGid; } else { })
    );
}
