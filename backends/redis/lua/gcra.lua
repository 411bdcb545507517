-- Tollgate: GCRA (Rust reference: algorithms/src/gcra.rs).
--
-- This file defines one function; the store runs it through layered.lua,
-- which holds the KEYS/ARGV layout (one layer = one call of this function).
--
--   gcra(burst, interval_us, _, tat, _, _, now, cost)
--
-- Layer ARGV: algorithm 2, cost, burst, interval_us, 0.
-- State: one cell, the TAT in µs, stored as one integer (Redis keeps an
--   integer value inside the key's object: the smallest state); nil: none.
--   No other time is kept: every write leaves the TAT after its own time,
--   so a clock that steps back never refills twice (see the Rust reference).
-- Returns: allowed (boolean), limit, remaining, reset_after µs,
--   retry_after µs (-1 when admitted), and when admitted the TTL in
--   milliseconds and the next cells (a, b, c). No table is built.
local function gcra(burst, interval, _, tat, _, _, now, cost)
  local tolerance = burst * interval
  local t = now
  local base = t
  if tat and tat > t then
    base = tat
  end
  local new_tat = base + cost * interval
  -- new_tat is after now (cost and interval are at least 1), so the
  -- reset_after and the TTL need no after() or floor of 1 ms.
  local ahead = new_tat - t
  if ahead <= tolerance then
    return true, burst, fdiv(tolerance - ahead, interval), ahead, -1,
      cdiv(ahead, 1000), new_tat, 0, 0
  end
  -- Admitted once the effective time reaches new_tat - tolerance (base does
  -- not move before then). The max() guards states written under other
  -- parameters, or before the clock stepped back.
  local retry_at = new_tat - tolerance
  return false, burst, fdiv(max(tolerance - (base - t), 0), interval),
    after(base, now), after(retry_at, now)
end
