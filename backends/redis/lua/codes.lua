-- Tollgate: the algorithm codes, as the store sends them in each layer's
-- first argument (src/script.rs: `Code`; a test checks the two agree).
local TOKEN_BUCKET = 1
local GCRA = 2
local FIXED_WINDOW = 3
local SLIDING_WINDOW = 4
local SLIDING_LOG = 5
