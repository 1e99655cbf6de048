-- wrk script of scripts/bench: the same GET for every request (range scans).
--   wrk ... -s wrk_path.lua URL -- PATH
local path
function init(args) path = args[1] end
function request() return wrk.format("GET", path) end
