-- Tollgate: token bucket (Rust reference: algorithms/src/token_bucket.rs).
--
-- This file defines one function; the store runs it through layered.lua,
-- which holds the KEYS/ARGV layout (one layer = one call of this function).
--
--   token_bucket(capacity, refill, period_us, full_at, remainder, _, now, cost)
--
-- Layer ARGV: algorithm 1, cost, capacity, refill, period_us.
-- State: cells {full at µs, remainder}: tokens are scaled by period_us, so
--   refill scaled tokens accrue per µs; before `full_at` the bucket holds
--   full + remainder − (full_at − t) × refill, from it on it is full
--   (0 ≤ remainder < refill). Stored as one integer when the remainder is
--   0 (always, when refill divides period_us), else as "a b". nil: the key
--   holds no state (a new key starts full). No time besides is kept (see
--   the Rust reference on a clock that steps back).
-- Returns: allowed (boolean), limit, remaining, reset_after µs,
--   retry_after µs (-1 when admitted), and when admitted the TTL in
--   milliseconds and the next cells (a, b, c). No table is built.

-- The scaled level at `now` (Rust: level_at).
local function token_bucket_level(full, refill, full_at, remainder, now)
  if not full_at or now >= full_at then
    return full
  end
  local until_full = full_at - now
  -- Compared first so the product stays below 2^53: this far from full
  -- the bucket is empty (a state written under other parameters).
  if until_full >= cdiv(full + remainder, refill) then
    return 0
  end
  local deficit = max(until_full * refill - remainder, 0)
  return full - min(deficit, full)
end

local function token_bucket(capacity, refill, period, full_at, remainder, _, now, cost)
  local full = capacity * period
  local level = token_bucket_level(full, refill, full_at, remainder, now)
  local need = cost * period
  if level >= need then
    local left = level - need
    -- left is below full (need is at least one period): full again after
    -- until_full >= 1 µs, so no after() or floor of 1 ms is needed.
    local deficit = full - left
    local until_full = cdiv(deficit, refill)
    return true, capacity, fdiv(left, period), until_full, -1,
      cdiv(until_full, 1000), now + until_full, until_full * refill - deficit, 0
  end
  return false, capacity, fdiv(level, period), cdiv(full - level, refill),
    cdiv(need - level, refill)
end
