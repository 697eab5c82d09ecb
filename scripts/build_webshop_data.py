"""Build the shipped WebShop catalog: products and human-style goals in WebShop's own format.

    python scripts/build_webshop_data.py            # writes plugins/envs/webshop/data/webshop_catalog.json.gz
    python scripts/build_webshop_data.py --check    # exit 1 when the shipped file is out of date

The output is deterministic (fixed seed, curated vocabularies below, gzip without a
timestamp) and holds ``{"items": [...], "attributes": {...}, "human_goals": {...}}``
with the field names of WebShop's ``items_shuffle*.json``, ``items_ins_v2*.json``
and ``items_human_ins.json``; the env adds the price clause and price bound to each
goal when it loads them, as WebShop does.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import random
import string
import sys
from dataclasses import dataclass
from pathlib import Path

SEED = 20220701
PRODUCTS_PER_KIND = 20
NUM_GOALS = 1000
OUTPUT = Path(__file__).resolve().parents[1] / "plugins" / "envs" / "webshop" / "data" / "webshop_catalog.json.gz"


@dataclass(frozen=True)
class Kind:
    """A product type: its noun (also the WebShop query), category path and vocabularies."""

    noun: str
    path: str
    low: float
    high: float
    mods: str  # "|"-separated variants that tell products apart (flavours, styles, materials)
    attrs: str  # "|"-separated WebShop-style attributes
    options: dict[str, str]  # option group -> "|"-separated values
    features: str  # "|"-separated feature sentences


def K(noun, path, low, high, mods, attrs, options, features):  # noqa: N802 - short for the tables
    return Kind(noun, path, low, high, mods, attrs, options, features)


SIZES = "small|medium|large|x-large|xx-large"
CATEGORIES: dict[str, tuple[str, str, list[Kind]]] = {
    "beauty": (
        "Beauty & Personal Care",
        "Lumina|Velvetine|Aurora Botanics|PureGlow|Maison Belle|Nordic Bloom|Sunkissed|Evergreen Apothecary",
        [
            K(
                "shampoo",
                "Hair Care › Shampoo & Conditioner › Shampoos",
                7,
                32,
                "argan oil|tea tree|coconut milk|rosemary mint|biotin|charcoal|keratin|aloe vera",
                "sulfate free|paraben free|natural ingredients|dry hair|hair growth|cruelty free|color treated hair|daily use",
                {
                    "size": "8 fl oz (pack of 1)|12 fl oz (pack of 1)|16 fl oz (pack of 1)|16 fl oz (pack of 2)|33.8 fl oz (pack of 1)",
                    "scent": "lavender|citrus|unscented|eucalyptus|vanilla|fresh mint",
                },
                "gently cleanses without stripping natural oils|leaves hair soft, shiny and easy to manage|rich lather that rinses clean",
            ),
            K(
                "face moisturizer",
                "Skin Care › Face › Creams & Moisturizers",
                9,
                45,
                "hyaluronic acid|vitamin c|retinol|green tea|ceramide|collagen|niacinamide|rose water",
                "anti aging|fine lines|sensitive skin|oil free|fragrance free|dark spots|dry skin|non greasy",
                {"size": "1 fl oz|1.7 fl oz|2 fl oz|3.4 fl oz"},
                "absorbs quickly and hydrates for 24 hours|lightweight texture that works under makeup|dermatologist tested formula",
            ),
            K(
                "lipstick",
                "Makeup › Lips › Lipstick",
                6,
                28,
                "matte|satin|velvet|creamy|liquid|sheer",
                "long lasting|highly pigmented|cruelty free|moisturizing|waterproof|vegan",
                {"color": "ruby red|nude pink|berry|coral|mauve|wine|classic red|peach"},
                "smooth one-swipe color that does not feather|enriched with vitamin e and shea butter|slim bullet fits in any purse",
            ),
            K(
                "eyeshadow palette",
                "Makeup › Eyes › Eyeshadow",
                8,
                40,
                "smoky|nude|shimmer|glitter|neutral|sunset",
                "highly pigmented|long lasting|easy to blend|cruelty free|travel size|water resistant",
                {"style": "12 colors|18 colors|35 colors"},
                "buttery shades that build from sheer to bold|includes a mirror and a dual-ended brush|mix of matte and metallic finishes",
            ),
            K(
                "hair extensions",
                "Hair Care › Hair Extensions, Wigs & Accessories › Hair Extensions",
                18,
                90,
                "clip in|tape in|ponytail|halo|wavy|straight|curly",
                "natural looking|long lasting|heat resistant|human hair|easy to apply|high quality",
                {
                    "color": "jet black|dark brown|ash blonde|honey blonde|auburn|platinum",
                    "size": "14 inch|18 inch|22 inch",
                },
                "blends seamlessly with your own hair|can be curled, straightened and washed|secure hold that stays in place all day",
            ),
        ],
    ),
    "fashion": (
        "Clothing, Shoes & Jewelry",
        "Urban Thread|Coastline|Maple & Moss|Northfield|Lark Lane|Bravo Basics|Willow Row|Ironclad",
        [
            K(
                "women's dress",
                "Women › Clothing › Dresses",
                19,
                65,
                "floral|wrap|maxi|midi|bodycon|boho|a-line|sleeveless",
                "machine wash|polyester spandex|casual|short sleeve|elastic waist|soft fabric",
                {"color": "black|navy blue|wine red|floral white|green|pink", "size": SIZES},
                "flowy silhouette for parties, vacations and everyday wear|breathable fabric that keeps you cool|"
                "pairs with sandals, sneakers or heels",
            ),
            K(
                "men's t-shirt",
                "Men › Clothing › Shirts › T-Shirts",
                10,
                35,
                "crew neck|v neck|graphic|pocket|henley|performance",
                "cotton|short sleeve|regular fit|machine wash|moisture wicking|slim fit",
                {"color": "white|black|heather grey|navy|olive green|red", "size": SIZES},
                "tagless collar for all-day comfort|pre-shrunk so it keeps its shape|great on its own or as a layer",
            ),
            K(
                "hoodie",
                "Men › Clothing › Fashion Hoodies & Sweatshirts",
                22,
                60,
                "pullover|zip up|fleece|oversized|sherpa lined|lightweight",
                "long sleeve|drawstring closure|machine wash|fleece lined|kangaroo pocket|relaxed fit",
                {"color": "black|charcoal|maroon|navy|sand|forest green", "size": SIZES},
                "ribbed cuffs and hem keep the warmth in|adjustable hood with flat drawcords|soft brushed interior",
            ),
            K(
                "jeans",
                "Women › Clothing › Jeans",
                25,
                70,
                "high waisted|skinny|straight leg|bootcut|mom|wide leg",
                "stretch fabric|button closure|machine wash|slim fit|butt lifting|classic fit",
                {"color": "light wash|medium wash|dark wash|black|white", "size": "2|4|6|8|10|12|14"},
                "five-pocket styling with a flattering rise|denim that moves with you|holds its shape wash after wash",
            ),
            K(
                "winter jacket",
                "Women › Clothing › Coats, Jackets & Vests",
                45,
                160,
                "puffer|parka|quilted|faux fur lined|down|hooded",
                "water resistant|zipper closure|windproof|long sleeve|warm lining|packable",
                {"color": "black|khaki|navy|burgundy|olive|white", "size": SIZES},
                "insulated body keeps you warm down to freezing|multiple zip pockets for phone and keys|storm flap blocks wind",
            ),
        ],
    ),
    "shoes": (
        "Clothing, Shoes & Jewelry",
        "Stride|Peakline|Solstice|Cobble & Co|Fleetfoot|Harbor|Trailmark|Bellamy",
        [
            K(
                "running shoes",
                "Men › Shoes › Athletic › Running",
                35,
                130,
                "lightweight|trail|cushioned|breathable mesh|road|knit",
                "non slip|rubber sole|arch support|memory foam|lace up|shock absorbing",
                {"color": "black white|grey|navy|red|all black|blue", "size": "7|8|8.5|9|9.5|10|10.5|11|12"},
                "responsive foam midsole returns energy with every step|padded collar and tongue|true to size fit",
            ),
            K(
                "women's sandals",
                "Women › Shoes › Sandals",
                18,
                60,
                "flat|platform|wedge|slide|strappy|gladiator",
                "open toe|ankle strap|arch support|non slip|comfortable|rubber sole",
                {"color": "black|tan|white|silver|brown|gold", "size": "6|6.5|7|7.5|8|8.5|9|10"},
                "cushioned footbed for all-day walking|adjustable buckle for a custom fit|dresses up or down",
            ),
            K(
                "men's boots",
                "Men › Shoes › Boots",
                50,
                160,
                "chelsea|work|hiking|combat|chukka|snow",
                "waterproof|slip resistant|steel toe|rubber sole|genuine leather|ankle support",
                {"color": "brown|black|tan|dark brown", "size": "8|9|10|11|12|13"},
                "sturdy outsole grips wet and icy ground|removable cushioned insole|built to last for years",
            ),
            K(
                "slippers",
                "Women › Shoes › Slippers",
                12,
                40,
                "fuzzy|house|moccasin|open toe|cozy knit|scuff",
                "anti slip|indoor outdoor|machine washable|rubber sole|warm lining|memory foam",
                {"color": "grey|pink|beige|black|leopard", "size": "5-6|7-8|9-10|11-12"},
                "plush lining keeps feet warm|slip-on design for easy wear|quiet sole for hardwood floors",
            ),
            K(
                "loafers",
                "Men › Shoes › Loafers & Slip-Ons",
                30,
                110,
                "penny|suede|driving|tassel|leather|boat",
                "slip on|rubber sole|genuine leather|lightweight|breathable|cushioned insole",
                {"color": "black|brown|navy|tan|grey", "size": "8|9|10|11|12"},
                "classic moc-toe construction|flexible sole bends with your foot|smart enough for the office",
            ),
        ],
    ),
    "grocery": (
        "Grocery & Gourmet Food",
        "Harvest Table|Green Meadow|Bluebird Farms|Copper Kettle|Sunny Acres|Wild Oak|Golden Grove|Pantry Co",
        [
            K(
                "ground coffee",
                "Beverages › Coffee, Tea & Cocoa › Coffee › Ground Coffee",
                8,
                35,
                "dark roast|medium roast|french vanilla|colombian|espresso|hazelnut|breakfast blend",
                "organic|fair trade|non gmo|low acid|kosher|small batch",
                {"size": "12 ounce (pack of 1)|12 ounce (pack of 2)|2 pound (pack of 1)|32 ounce (pack of 1)"},
                "roasted in small batches for a smooth finish|works in drip, pour over and french press|resealable bag locks in freshness",
            ),
            K(
                "green tea",
                "Beverages › Coffee, Tea & Cocoa › Tea › Green Tea",
                5,
                25,
                "matcha|jasmine|ginger lemon|mint|honey|sencha",
                "organic|gluten free|non gmo|sugar free|natural ingredients|low caffeine",
                {"size": "20 count (pack of 1)|20 count (pack of 6)|100 count (pack of 1)|40 count (pack of 3)"},
                "individually wrapped tea bags for freshness|brews a bright, clean cup in three minutes|enjoy hot or iced",
            ),
            K(
                "beef jerky",
                "Snack Foods › Jerky & Dried Meats › Beef Jerky",
                8,
                40,
                "teriyaki|original|peppered|sweet and spicy|smoked|hickory",
                "high protein|gluten free|low fat|keto friendly|no preservatives|grass fed",
                {"size": "2.85 ounce (pack of 4)|3.25 ounce (pack of 1)|10 ounce (pack of 1)|1 ounce (pack of 12)"},
                "marinated and slow smoked for real flavor|tender bites that are easy to chew|perfect for hiking, road trips and lunch boxes",
            ),
            K(
                "granola bars",
                "Snack Foods › Bars › Granola Bars",
                6,
                30,
                "chocolate chip|peanut butter|oats and honey|almond|blueberry|dark chocolate",
                "gluten free|low sugar|high protein|non gmo|plant based|kosher",
                {"size": "12 count (pack of 1)|6 count (pack of 3)|24 count (pack of 1)"},
                "made with whole grain oats|individually wrapped for on-the-go snacking|no artificial flavors or colors",
            ),
            K(
                "bacon",
                "Meat Substitutes › Bacon",
                6,
                30,
                "smoked|peppered|maple|hickory smoked|applewood|tempeh",
                "gluten free|vegetarian|plant based|non gmo|high protein|ready to eat",
                {"size": "4 ounce (pack of 1)|4 ounce (pack of 2)|5 ounce (pack of 6)|8 ounce (pack of 1)"},
                "crisps up in the pan in minutes|savory smoky taste without the meat|great in sandwiches, salads and breakfast",
            ),
        ],
    ),
    "electronics": (
        "Electronics",
        "Voltix|Sonara|Nexon|Quanta|Brightwave|Koda|Arclight|Zentro",
        [
            K(
                "bluetooth headphones",
                "Headphones, Earbuds & Accessories › Headphones › Over-Ear Headphones",
                25,
                150,
                "over ear|on ear|foldable|studio|kids|sports",
                "noise cancelling|wireless bluetooth|long battery life|hands free|built in microphone|fast charging",
                {"color": "black|white|rose gold|blue|silver"},
                "deep bass and crisp highs|soft protein leather ear cushions|up to 40 hours of playtime on one charge",
            ),
            K(
                "usb c charger",
                "Computers & Accessories › Chargers & Adapters",
                10,
                45,
                "20w|30w|65w|dual port|gan|wall",
                "fast charging|foldable plug|overheat protection|travel friendly|high speed|compact design",
                {"color": "white|black", "style": "charger only|with 6ft cable|2 pack"},
                "charges a phone to 50 percent in 30 minutes|works with phones, tablets and laptops|smart chip picks the safest current",
            ),
            K(
                "wireless mouse",
                "Computers & Accessories › Computer Accessories & Peripherals › Keyboards, Mice & Accessories › Mice",
                9,
                50,
                "ergonomic|silent|vertical|rechargeable|gaming|travel",
                "wireless bluetooth|plug and play|long battery life|ergonomic design|silent click|adjustable dpi",
                {"color": "black|grey|white|pink|blue"},
                "smooth tracking on almost any surface|contoured shape reduces wrist strain|nano receiver stores inside the mouse",
            ),
            K(
                "hdmi cable",
                "Accessories & Supplies › Audio & Video Accessories › Cables › HDMI Cables",
                6,
                30,
                "4k|8k|braided|right angle|flat|ultra slim",
                "gold plated|high speed|high definition|plug and play|ethernet support|durable",
                {"size": "3 ft|6 ft|10 ft|15 ft|25 ft"},
                "supports 4k at 60hz and hdr|works with tv, laptop, monitor and game consoles|tested to bend over 10,000 times",
            ),
            K(
                "portable speaker",
                "Portable Audio & Video › Portable Speakers & Docks › Portable Bluetooth Speakers",
                20,
                120,
                "mini|outdoor|party|shower|rugged|retro",
                "waterproof|wireless bluetooth|long battery life|stereo sound|built in microphone|easy to carry",
                {"color": "black|blue|red|green|grey"},
                "360 degree sound fills the room|pair two speakers for stereo|ip67 rated against dust and water",
            ),
        ],
    ),
    "home": (
        "Home & Kitchen",
        "Hearthwood|Casa Verde|Oak & Ivy|Nestwell|Linden Home|Birchline|Stonebridge|Cozyhaus",
        [
            K(
                "coffee table",
                "Furniture › Living Room Furniture › Tables › Coffee Tables",
                60,
                260,
                "farmhouse|mid century|lift top|round|industrial|glass",
                "easy assembly|storage shelf|solid wood|living room|metal frame|space saving",
                {"color": "rustic brown|black|white|walnut|grey"},
                "open lower shelf for books and baskets|scratch resistant top wipes clean|all hardware and tools included",
            ),
            K(
                "office chair",
                "Furniture › Home Office Furniture › Home Office Chairs",
                70,
                280,
                "ergonomic|mesh|executive|high back|swivel|task",
                "lumbar support|height adjustable|easy assembly|padded armrests|high density foam|heavy duty",
                {"color": "black|grey|white|blue|pink"},
                "tilts and locks for a comfortable recline|smooth rolling casters protect floors|supports up to 300 pounds",
            ),
            K(
                "bookshelf",
                "Furniture › Living Room Furniture › Bookcases",
                45,
                200,
                "5 tier|ladder|corner|industrial|cube|floating",
                "easy assembly|space saving|metal frame|storage space|engineered wood|living room",
                {"color": "rustic brown|black|white|grey|walnut"},
                "anti-tip kit keeps it steady against the wall|each shelf holds up to 50 pounds|fits books, plants and decor",
            ),
            K(
                "bed sheets",
                "Bedding › Sheets & Pillowcases › Sheet & Pillowcase Sets",
                20,
                90,
                "microfiber|bamboo|egyptian cotton|linen|flannel|percale",
                "deep pocket|machine washable|wrinkle free|hypoallergenic|cooling|fade resistant",
                {
                    "color": "white|grey|navy|sage green|ivory|light blue",
                    "size": "twin|full|queen|king|california king",
                },
                "fitted sheet stretches over mattresses up to 16 inches|gets softer with every wash|"
                "set includes flat sheet, fitted sheet and pillowcases",
            ),
            K(
                "throw pillow covers",
                "Home Décor Products › Decorative Pillows, Inserts & Covers › Throw Pillow Covers",
                9,
                35,
                "velvet|boho|farmhouse|linen|faux fur|geometric",
                "hidden zipper|machine washable|living room|double sided|fade resistant|soft texture",
                {
                    "color": "beige|dark green|mustard yellow|navy|blush pink|grey",
                    "size": "16 x 16 inch|18 x 18 inch|20 x 20 inch|12 x 20 inch",
                },
                "set of 2 covers, inserts not included|refresh a sofa, bed or reading nook|neat stitching that does not fray",
            ),
        ],
    ),
    "garden": (
        "Patio, Lawn & Garden",
        "GreenThumb|Terra Vista|Sunpath|Backyard Bliss|Fernhill|Meadowlark|Rainleaf|Gardenia Works",
        [
            K(
                "garden hose",
                "Watering Equipment › Garden Hoses",
                20,
                80,
                "expandable|heavy duty|flexible|coiled|hybrid|rubber",
                "leak proof|kink free|easy storage|solid brass fittings|durable material|spray nozzle",
                {"size": "25 ft|50 ft|75 ft|100 ft"},
                "comes with a 10 pattern spray nozzle|stays flexible in hot and cold weather|coils neatly for storage",
            ),
            K(
                "solar lights",
                "Outdoor Décor › Outdoor Lighting › Pathway Lights",
                15,
                60,
                "pathway|string|fence|spot|lantern|garden stake",
                "waterproof|auto on off|easy install|long lasting|dusk to dawn|no wiring",
                {"color": "warm white|cool white|multicolor", "size": "6 pack|8 pack|12 pack"},
                "charges in sunlight and glows up to 10 hours|no wiring needed, push into the ground|weatherproof for rain and snow",
            ),
            K(
                "plant pots",
                "Gardening & Lawn Care › Pots, Planters & Container Accessories › Planters",
                12,
                55,
                "ceramic|self watering|hanging|terracotta|plastic|cylinder",
                "drainage hole|indoor outdoor|modern design|with saucer|lightweight|easy to clean",
                {"color": "white|black|grey|sage green|terracotta", "size": "4 inch|6 inch|8 inch|10 inch|12 inch"},
                "drainage hole with a rubber plug|great for succulents, herbs and houseplants|matte glaze fits any decor",
            ),
            K(
                "patio umbrella",
                "Patio Furniture & Accessories › Umbrellas & Shades › Patio Umbrellas",
                40,
                180,
                "market|cantilever|offset|tilt|solar lighted|beach",
                "uv protection|fade resistant|wind resistant|push button tilt|sturdy ribs|easy open",
                {"color": "beige|red|navy|taupe|green|tan", "size": "7.5 ft|9 ft|10 ft|11 ft"},
                "crank lift opens and closes with ease|air vent lets wind pass through|fits most patio tables",
            ),
            K(
                "bird feeder",
                "Birding & Wildlife › Bird Feeders",
                12,
                50,
                "hanging|window|tube|platform|copper|cedar",
                "squirrel proof|weather resistant|easy to clean|easy to fill|large capacity|metal roof",
                {"color": "green|black|red|brown"},
                "holds up to 3 pounds of seed|multiple perches for many birds at once|twist-off top for quick refills",
            ),
        ],
    ),
    "sports": (
        "Sports & Outdoors",
        "Summit|Ironpeak|FlexFit|Trailhead|Apex Motion|BlueRidge|Pulse|Everstride",
        [
            K(
                "yoga mat",
                "Exercise & Fitness › Yoga › Yoga Mats",
                15,
                70,
                "thick|travel|cork|tpe|natural rubber|printed",
                "non slip|eco friendly|carrying strap|high density|sweat resistant|easy to clean",
                {"color": "purple|black|blue|pink|teal|grey", "size": "72 x 24 inch|72 x 26 inch|80 x 32 inch"},
                "cushions knees and joints on hard floors|textured surface grips in any pose|rolls up light for the studio",
            ),
            K(
                "water bottle",
                "Accessories › Sports Water Bottles",
                12,
                40,
                "insulated stainless steel|sports|glass|collapsible|motivational|kids",
                "bpa free|leak proof|keeps drinks cold|dishwasher safe|wide mouth|easy to carry",
                {"color": "black|white|mint|navy|coral|lavender", "size": "18 oz|24 oz|32 oz|40 oz|64 oz"},
                "keeps water cold for 24 hours and coffee hot for 12|fits most cup holders|sweat-free outside",
            ),
            K(
                "dumbbells",
                "Exercise & Fitness › Strength Training Equipment › Dumbbells",
                25,
                150,
                "adjustable|neoprene|hex|vinyl|rubber coated|cast iron",
                "non slip grip|home gym|anti roll|space saving|durable|easy to use",
                {"size": "5 lb (pair)|10 lb (pair)|15 lb (pair)|20 lb (pair)|25 lb (pair)"},
                "hex ends keep them from rolling away|knurled handle for a secure grip|quiet coating protects floors",
            ),
            K(
                "camping tent",
                "Outdoor Recreation › Camping & Hiking › Tents & Shelters › Tents",
                50,
                250,
                "dome|instant pop up|backpacking|cabin|family|beach",
                "waterproof|easy setup|lightweight|rainfly included|carry bag|good ventilation",
                {"size": "2 person|4 person|6 person|8 person", "color": "green|grey|orange|blue"},
                "sets up in under 5 minutes|mesh windows for airflow and stargazing|taped seams keep rain out",
            ),
            K(
                "resistance bands",
                "Exercise & Fitness › Strength Training Equipment › Resistance Bands",
                9,
                40,
                "loop|fabric|tube|long|booty|pull up",
                "non slip|carrying bag|latex free|home workout|heavy duty|portable",
                {"style": "set of 3|set of 5|set of 11"},
                "five resistance levels from light to extra heavy|great for glutes, legs and arms|includes an exercise guide",
            ),
        ],
    ),
    "toys": (
        "Toys & Games",
        "Brickly|Wonderbox|Tinytown|Playwise|Jolly Jump|Moonbeam|Kiddo Lab|Funforge",
        [
            K(
                "building blocks",
                "Building Toys › Building Sets",
                15,
                90,
                "classic|city|space|castle|magnetic|dinosaur",
                "educational|bpa free|creative play|gift for kids|easy to assemble|compatible with major brands",
                {"size": "200 pieces|500 pieces|1000 pieces"},
                "builds fine motor skills and imagination|storage box included|pieces snap together firmly",
            ),
            K(
                "jigsaw puzzle",
                "Puzzles › Jigsaw Puzzles",
                10,
                35,
                "landscape|animal|floral|world map|vintage|ocean",
                "thick pieces|perfect fit|family game|gift for adults|premium quality|eco friendly",
                {"size": "500 pieces|1000 pieces|1500 pieces|2000 pieces"},
                "glare-free linen finish|comes with a full-size poster|sturdy box for storage",
            ),
            K(
                "plush toy",
                "Stuffed Animals & Plush Toys › Plush Figures",
                8,
                40,
                "teddy bear|unicorn|dinosaur|bunny|sloth|penguin",
                "super soft|machine washable|gift for kids|safe materials|cute design|huggable",
                {"size": "8 inch|12 inch|16 inch|24 inch", "color": "brown|pink|white|grey"},
                "embroidered eyes safe for toddlers|perfect cuddle buddy for naps|stuffed with premium cotton",
            ),
            K(
                "rc car",
                "Remote & App Controlled Vehicles & Parts › Cars & Trucks",
                25,
                110,
                "monster truck|off road|drift|stunt|racing|rock crawler",
                "rechargeable battery|high speed|all terrain|2.4ghz remote control|gift for kids|shock absorbing",
                {"color": "red|blue|green|orange"},
                "reaches up to 20 miles per hour|two batteries for 40 minutes of play|tough body survives crashes",
            ),
            K(
                "board game",
                "Games & Accessories › Board Games",
                15,
                60,
                "strategy|family|party|cooperative|word|trivia",
                "family game night|easy to learn|ages 8 and up|quick to play|award winning|2 to 4 players",
                {"style": "standard edition|deluxe edition|travel edition"},
                "games last 30 to 45 minutes|clear rules you can learn in minutes|high quality cards and tokens",
            ),
        ],
    ),
    "pets": (
        "Pet Supplies",
        "Pawsome|Happy Tails|Whisker Co|Barkley|Furbaby|Kibble & Co|Snuggle Paws|Petra",
        [
            K(
                "dog bed",
                "Dogs › Beds & Furniture › Beds",
                25,
                110,
                "orthopedic|donut|bolster|memory foam|elevated|calming",
                "machine washable|non slip bottom|removable cover|waterproof lining|easy to clean|joint relief",
                {"size": "small|medium|large|x-large", "color": "grey|brown|beige|navy"},
                "raised rim supports head and neck|eases joint pain in older dogs|fluffy filling holds its shape",
            ),
            K(
                "cat litter",
                "Cats › Litter & Housebreaking › Litter",
                10,
                40,
                "clumping clay|pine|tofu|crystal|corn|walnut",
                "odor control|dust free|low tracking|flushable|multi cat|unscented",
                {"size": "10 lb|20 lb|25 lb|40 lb"},
                "forms tight clumps for easy scooping|locks in odors for 7 days|gentle on sensitive paws",
            ),
            K(
                "dog collar",
                "Dogs › Collars, Harnesses & Leashes › Collars",
                8,
                30,
                "reflective|leather|padded|martingale|floral|breakaway",
                "adjustable|quick release buckle|comfortable fit|heavy duty|lightweight|durable",
                {"color": "black|red|pink|blue|orange|purple", "size": "small|medium|large"},
                "reflective stitching for night walks|sturdy d-ring for leash and tags|soft edges do not rub fur",
            ),
            K(
                "cat toy",
                "Cats › Toys › Teasers & Wands",
                6,
                30,
                "feather wand|interactive|catnip|laser|tunnel|ball track",
                "indoor cats|relieve boredom|safe materials|exercise|durable|kitten friendly",
                {"style": "single|2 pack|5 pack"},
                "keeps indoor cats active and happy|bell and feathers spark hunting instinct|sturdy enough for rough play",
            ),
            K(
                "pet shampoo",
                "Dogs › Grooming › Shampoos",
                8,
                30,
                "oatmeal|flea and tick|puppy|whitening|lavender|coconut",
                "sensitive skin|natural ingredients|paraben free|soap free|itchy skin relief|fresh scent",
                {"size": "16 fl oz|17 fl oz|32 fl oz|1 gallon"},
                "soothes dry and itchy skin|rinses out easily for quick baths|safe for dogs and puppies",
            ),
        ],
    ),
    "health": (
        "Health & Household",
        "Vitalis|NatureWay Labs|Pureform|Wellspring|Clearhealth|Bodycraft|Zenith Care|Greenleaf",
        [
            K(
                "vitamin c gummies",
                "Vitamins, Minerals & Supplements › Vitamins › Vitamin C",
                9,
                35,
                "orange|immune support|kids|zinc|elderberry|sugar free",
                "gluten free|vegan|non gmo|no artificial colors|gelatin free|natural flavors",
                {"size": "60 count|90 count|120 count|150 count"},
                "two gummies a day for immune support|tasty citrus flavor kids and adults love|third-party tested for purity",
            ),
            K(
                "electric toothbrush",
                "Oral Care › Toothbrushes & Accessories › Powered Toothbrushes",
                20,
                120,
                "sonic|rechargeable|travel|kids|whitening|smart",
                "long battery life|2 minute timer|waterproof|travel case|gentle on gums|5 cleaning modes",
                {"color": "white|black|pink|blue"},
                "removes up to 10 times more plaque than a manual brush|one charge lasts 30 days|includes 4 brush heads",
            ),
            K(
                "protein powder",
                "Sports Nutrition › Protein › Whey",
                20,
                70,
                "whey isolate|grass fed whey|pea|casein|collagen|egg white",
                "gluten free|low carb|no artificial sweeteners|keto friendly|muscle recovery|high protein",
                {
                    "flavor name": "chocolate|vanilla|cookies and cream|strawberry|unflavored",
                    "size": "1 pound|2 pound|5 pound",
                },
                "25 grams of protein per scoop|mixes smooth with water or milk|supports lean muscle after workouts",
            ),
            K(
                "essential oil diffuser",
                "Health Care › Alternative Medicine › Aromatherapy",
                18,
                60,
                "ultrasonic|wood grain|ceramic|cool mist|glass|mini",
                "auto shut off|whisper quiet|color changing lights|large capacity|timer setting|easy to clean",
                {"color": "light wood|dark wood|white|black"},
                "runs up to 10 hours on one fill|adds gentle humidity to dry rooms|turns off by itself when empty",
            ),
            K(
                "heating pad",
                "Health Care › Pain Relievers › Hot & Cold Therapies › Heating Pads",
                18,
                55,
                "electric|microwavable|neck and shoulder|back|moist heat|weighted",
                "auto shut off|fast heating|machine washable|extra large|pain relief|soft flannel",
                {"size": "12 x 15 inch|12 x 24 inch|20 x 24 inch", "color": "grey|blue|pink"},
                "six heat settings for custom comfort|heats up in 30 seconds|relieves cramps and sore muscles",
            ),
        ],
    ),
    "office": (
        "Office Products",
        "Inkwell|Paperly|DeskMate|Scribe & Co|Northnote|Clipwise|Brightdesk|Foliant",
        [
            K(
                "notebook",
                "Office & School Supplies › Paper › Notebooks & Writing Pads",
                6,
                30,
                "hardcover|spiral|dotted|lined|leather|kraft",
                "thick paper|lay flat|acid free paper|no bleed|elastic closure|inner pocket",
                {"size": "a5|b5|letter size", "color": "black|navy|green|pink|brown"},
                "192 numbered pages of 100 gsm paper|ribbon bookmark keeps your place|great for journaling and school",
            ),
            K(
                "gel pens",
                "Office & School Supplies › Writing & Correction Supplies › Pens & Refills",
                6,
                25,
                "retractable|fine point|glitter|pastel|metallic|colored",
                "quick dry|smooth writing|comfortable grip|smudge proof|acid free|vivid colors",
                {"style": "12 pack|24 pack|36 pack"},
                "0.5 mm tip for neat, precise lines|great for notes, planners and coloring|ink dries fast for left-handed writers",
            ),
            K(
                "desk organizer",
                "Office & School Supplies › Desk Accessories & Workspace Organizers",
                12,
                45,
                "mesh|wooden|rotating|drawer|acrylic|bamboo",
                "space saving|multi compartment|easy assembly|sturdy|pen holder|non slip feet",
                {"color": "black|white|gold|natural"},
                "keeps pens, notes and clips in one place|fits neatly on any desk|sturdy base does not tip",
            ),
            K(
                "printer paper",
                "Office & School Supplies › Paper › Copy & Multipurpose Paper",
                8,
                60,
                "multipurpose|premium|bright white|recycled|cardstock|photo",
                "jam free|acid free|smooth finish|92 bright|laser and inkjet|letter size",
                {"size": "1 ream|3 ream|5 ream|10 ream"},
                "500 sheets per ream|crisp, sharp text and vivid colors|made for everyday home and office printing",
            ),
            K(
                "sticky notes",
                "Office & School Supplies › Paper › Sticky Notes",
                5,
                22,
                "super sticky|lined|neon|pastel|pop up|transparent",
                "strong adhesive|repositionable|bright colors|residue free|easy peel|recyclable",
                {"size": "3 x 3 inch|4 x 6 inch|3 x 5 inch", "style": "6 pads|12 pads|24 pads"},
                "sticks to walls, doors and monitors|removes cleanly without marks|100 sheets per pad",
            ),
        ],
    ),
}

TITLE_FORMS = (
    "{brand} {mod} {noun}, {a1}, {a2}",
    "{a1} {mod} {noun} by {brand} - {a2}",
    "{brand} {mod} {noun} | {a1} and {a2}",
)
DESCRIPTION_FORMS = (
    "The {brand} {mod} {noun} is made for anyone who wants a {a1} and {a2} {noun}. {f1}. {f2}. "
    "Every order is backed by our 30-day money back guarantee.",
    "Meet your new favorite {noun}. {brand} designed this {mod} {noun} to be {a1}, {a2} and {a3}. {f1}. "
    "Thoughtfully made and carefully checked before it ships.",
    "Looking for a {mod} {noun}? {f2}. {f1}. It is {a1} and {a3}, and it makes a great gift. "
    "Questions? The {brand} team is happy to help.",
)
OPENINGS = ("i need", "i am looking for", "i want", "i'm looking for", "find me", "i would like", "looking for")
REVIEWS = {
    5: (
        ("Love it!", "Exactly what I was looking for. The {mod} {noun} is {a1} just as described."),
        ("Five stars", "Second time buying this {noun}. Great quality for the price and it arrived quickly."),
        ("Highly recommend", "My whole family uses it now. {f1}, no complaints at all."),
    ),
    4: (
        (
            "Very good",
            "Really nice {noun}. Took one star off because the packaging was damaged, but the product is fine.",
        ),
        ("Good value", "Does the job well and it is {a1}. Would buy again if the price stays the same."),
    ),
    3: (
        ("It's okay", "The {noun} is fine but not as {a1} as I hoped. Average overall."),
        ("Decent", "Works, but I expected a bit more from the {mod} version. Shipping was fast."),
    ),
    2: (("Disappointed", "Did not last as long as I expected. The {noun} looked different from the photos."),),
}
GROUP_PHRASES = {
    "color": ("in {v} color", "in {v}", "color {v}"),
    "size": ("in size {v}", "size {v}", "in {v}"),
    "scent": ("with {v} scent", "in {v} scent"),
    "style": ("in {v} style", "style {v}", "{v}"),
    "flavor name": ("in {v} flavor", "{v} flavored"),
}


def titled(text: str) -> str:
    small = {"and", "of", "with", "by", "for", "in", "to", "a", "the"}
    return " ".join(w if w in small else w[:1].upper() + w[1:] for w in text.split())


def split(field: str) -> list[str]:
    return field.split("|")


def new_asin(rng: random.Random, taken: set[str]) -> str:
    while True:
        asin = "B0" + "".join(rng.choices(string.ascii_uppercase + string.digits, k=8))
        if asin not in taken:
            taken.add(asin)
            return asin


def price_text(rng: random.Random, kind: Kind) -> str:
    dollars = int(rng.uniform(kind.low, kind.high))
    return f"${dollars}.{rng.choice(['99', '49', '95', '00', '89'])}"


def make_product(
    rng: random.Random, category: str, path: str, brands: list[str], kind: Kind, taken: set[str]
) -> tuple[dict, list[str], str]:
    """One product in items_shuffle format, its attributes, and its variant word."""
    mod, brand = rng.choice(split(kind.mods)), rng.choice(brands)
    attrs = rng.sample(split(kind.attrs), k=rng.randint(4, 5))
    slots = {"brand": brand, "mod": mod, "noun": kind.noun, "a1": attrs[0], "a2": attrs[1], "a3": attrs[2]}
    title = titled(rng.choice(TITLE_FORMS).format(**slots))
    features = split(kind.features)
    slots |= {"f1": features[0][:1].upper() + features[0][1:], "f2": features[1][:1].upper() + features[1][1:]}
    options = {}
    for i, (group, values) in enumerate(kind.options.items()):
        values = split(values)
        if i > 0 and rng.random() < 0.3:
            continue  # some products offer only their first option group
        picked = sorted(rng.sample(range(len(values)), k=rng.randint(min(3, len(values)), len(values))))
        options[group] = [{"value": values[j], "image": None} for j in picked]
    bullets = [
        f"{a.upper()} - {s[:1].upper() + s[1:]}" for a, s in zip(attrs[:3], rng.sample(features, k=3), strict=True)
    ]
    bullets.append("ALSO - " + ", ".join(attrs[3:]).capitalize())
    bullets.append(
        f"WHAT YOU GET - 1 x {brand} {titled(mod)} {titled(kind.noun)}, a 30-day return window "
        "and friendly customer service"
    )
    reviews, used = [], set()
    for score in sorted(rng.choices([5, 4, 3, 2], weights=[5, 3, 2, 1], k=rng.randint(2, 3)), reverse=True):
        head, body = rng.choice(REVIEWS[score])
        if head not in used:  # no product shows the same review twice
            used.add(head)
            reviews.append({"title": head.format(**slots), "score": score, "body": body.format(**slots)})
    item = {
        "asin": new_asin(rng, taken),
        "name": title,
        "category": category,
        "query": kind.noun,
        "product_category": f"{path} › {kind.path}",
        "pricing": price_text(rng, kind),
        "customization_options": options,
        "small_description": bullets,
        "full_description": rng.choice(DESCRIPTION_FORMS).format(**slots),
        "Reviews": reviews,
        "Rating": "N.A.",
    }
    return item, attrs, mod


def article(noun: str) -> str:
    if noun.endswith("s") and not noun.endswith("ss"):
        return ""
    return "an " if noun[0] in "aeiou" else "a "


def make_goal(rng: random.Random, item: dict, attrs: list[str], mod: str) -> dict:
    """A human-style instruction for ``item`` (items_human_ins format, without the price clause)."""
    # as WebShop's annotators did: any of the product's attributes, shown in its title or only on its features page
    wanted = rng.sample(attrs, k=rng.choice([1, 2, 2, 3]))
    options = []
    for group, contents in item["customization_options"].items():
        if rng.random() < 0.9:
            options.append((group, rng.choice(contents)["value"]))
    noun = item["query"]
    product = f"{mod} {noun}" if rng.random() < 0.8 else noun
    form = rng.randrange(3)
    verb = "is" if article(product) else "are"
    if form == 0:
        text = f"{article(wanted[0]) if article(product) else ''}{', '.join(wanted)} {product}"
    elif form == 1:
        text = f"{article(product)}{product} that {verb} {' and '.join(wanted)}"
    else:
        listed = ", ".join(wanted[:-1]) + " and " if len(wanted) > 1 else ""
        text = f"{article(product)}{product} which {verb} {listed}{wanted[-1]}"
    phrases = [rng.choice(GROUP_PHRASES.get(group, ("{v}",))).format(v=value) for group, value in options]
    if phrases:
        text += (", " if form else " ") + " and ".join(phrases)
    return {
        "instruction": f"{rng.choice(OPENINGS)} {text}",
        "instruction_attributes": wanted,
        "instruction_options": [value for _, value in options],
    }


def build_payload(seed: int = SEED) -> dict:
    """The catalog: items, attributes and goals in WebShop's formats."""
    rng = random.Random(seed)
    items, attributes, made, taken = [], {}, [], set()
    for category, (path, brands, kinds) in CATEGORIES.items():
        for kind in kinds:
            for _ in range(PRODUCTS_PER_KIND):
                item, attrs, mod = make_product(rng, category, path, split(brands), kind, taken)
                items.append(item)
                attributes[item["asin"]] = {"attributes": attrs}
                made.append((item, attrs, mod))
    human_goals: dict[str, list[dict]] = {}
    for item, attrs, mod in rng.sample(made, k=NUM_GOALS):
        human_goals[item["asin"]] = [make_goal(rng, item, attrs, mod)]
    rng.shuffle(items)  # WebShop's items file is shuffled too
    return {"items": items, "attributes": attributes, "human_goals": human_goals}


def encode(payload: dict) -> bytes:
    """gzip'd JSON with no timestamp, so equal payloads give equal bytes."""
    raw = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, compresslevel=9, mtime=0) as f:
        f.write(raw)
    return buffer.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=OUTPUT, help="where to write the .json.gz")
    parser.add_argument("--check", action="store_true", help="only check that the output is up to date")
    args = parser.parse_args(argv)
    data = encode(build_payload())
    if args.check:
        current = args.output.read_bytes() if args.output.is_file() else b""
        print("up to date" if current == data else f"{args.output} is out of date; rerun without --check")
        return 0 if current == data else 1
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_name(args.output.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, args.output)
    payload = json.loads(gzip.decompress(data))
    print(
        f"wrote {args.output}: {len(payload['items'])} products in {len(CATEGORIES)} categories, "
        f"{sum(len(g) for g in payload['human_goals'].values())} goals, {len(data) / 1024:.0f} KiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
