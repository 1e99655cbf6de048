-- wrk script of scripts/bench: GET /v1/stores/STORE/keys/KEY with keys drawn from a key
-- file (first column of each line), uniformly or with a skew.
--
--   wrk ... -s wrk_keys.lua URL -- KEYFILE STORE uniform|zipf [SEED]
--
-- zipf: the key of rank i (file order, which is random) is drawn with probability
-- proportional to 1 / i^0.99, as in YCSB's zipfian workload: a few keys take most of
-- the requests and stay in every cache.

local threads = 0
-- Runs in the main state once per thread: numbers the threads (a global in each).
function setup(thread)
  thread:set("thread_id", threads)
  threads = threads + 1
end

local paths = {}
local cdf = nil
local n = 0

function init(args)
  local file, store, mode, seed = args[1], args[2], args[3] or "uniform", tonumber(args[4] or "1")
  for line in io.lines(file) do
    local key = line:match("^([^\t]+)")
    if key then
      n = n + 1
      paths[n] = "/v1/stores/" .. store .. "/keys/" .. key
    end
  end
  -- Each thread its own sequence, the same on every run and for every system.
  math.randomseed(seed * 7919 + (thread_id or 0))
  if mode == "zipf" then
    cdf = {}
    local sum = 0
    for i = 1, n do
      sum = sum + 1 / (i ^ 0.99)
      cdf[i] = sum
    end
    for i = 1, n do cdf[i] = cdf[i] / sum end
  end
end

local function pick()
  if not cdf then return paths[math.random(n)] end
  local u = math.random()
  local lo, hi = 1, n
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if cdf[mid] < u then lo = mid + 1 else hi = mid end
  end
  return paths[lo]
end

function request()
  return wrk.format("GET", pick())
end
