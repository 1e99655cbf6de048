-- wrk script of scripts/bench: POST /v1/stores/STORE/keys:batchGet with KEYS keys drawn
-- uniformly from a key file (first column of each line) per request.
--
--   wrk ... -s wrk_batch.lua URL -- KEYFILE STORE KEYS [SEED]

local threads = 0
function setup(thread)
  thread:set("thread_id", threads)
  threads = threads + 1
end

local keys = {}
local n = 0
local per_request = 100
local path

function init(args)
  local file, store = args[1], args[2]
  per_request = tonumber(args[3] or "100")
  local seed = tonumber(args[4] or "1")
  path = "/v1/stores/" .. store .. "/keys:batchGet"
  for line in io.lines(file) do
    local key = line:match("^([^\t]+)")
    if key then
      n = n + 1
      keys[n] = key
    end
  end
  math.randomseed(seed * 7919 + (thread_id or 0))
end

function request()
  local parts = {}
  for i = 1, per_request do parts[i] = '"' .. keys[math.random(n)] .. '"' end
  local body = '{"keys":[' .. table.concat(parts, ",") .. ']}'
  return wrk.format("POST", path, {["Content-Type"] = "application/json"}, body)
end
